"""The trace corpus (bench/traces: real PyTorch models recorded on the CPU, and traces of PyTorch
jobs recorded under gpushim on an H200 and an H100): every trace parses and replays under every policy,
including the PyTorch-allocator baselines that scripts/bench compares the shim's pools with."""
import glob
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from shimtest import BIN, check_sanitizer_clean

MiB = 1 << 20
ANALYZE = os.path.join(BIN, "gpushim-analyze")
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "traces")
# The kinds of job issue 16 asks the corpus to cover (bench/record/models.py).
MODELS = {"cnn_train", "transformer_train", "lstm_train", "serving", "segmentation_train", "detection_infer",
          "finetune_adam"}
# Recorded on a GPU under gpushim (bench/traces/README.md): name -> (policy, the run's peak reserved).
GPU_TRACES = {"h200_transformer_caching": ("caching", 2478 * MiB), "h200_transformer_vmm": ("vmm", 2690 * MiB),
              "h100_transformer_caching": ("caching", 3143895040), "h100_transformer_vmm": ("vmm", 2791573504),
              "h200_steptime_caching": ("caching", 3143895040), "h200_steptime_vmm": ("vmm", 2778990592),
              "h200_steptime_vmm_run7": ("vmm", 2409891840)}
# Those recorded by pools whose code this build still runs: a replay under --gpu-time recorded is the
# run itself. (The others' caching pool has changed since; a change of the pools moves a trace out:
# h200_steptime_caching left when a stream-ordered free began to merge with the idle rest of its
# segment at once, issue 27, which places later blocks elsewhere than the recorded run did.)
SAME_POOLS = {"h200_steptime_vmm", "h200_steptime_vmm_run7"}
# The backlog a trace without reuse moments gets (analysis/gpu_time.h, kTypicalBacklogStepFraction).
TYPICAL_STEP_PERCENT = 5
# What replay --json lists of a device's driver_calls, each kind of call once.
DRIVER_CALL_KINDS = ("segment_allocs", "segment_frees", "physical_creates", "physical_releases", "maps", "unmaps",
                     "va_reserves", "va_frees", "synchronizes", "events_recorded", "fences_recorded", "forwarded_calls")


def analyze_json(*args):
    proc = subprocess.run([ANALYZE, *args, "--json"], capture_output=True, text=True, timeout=300)
    check_sanitizer_clean(proc.stderr, "gpushim-analyze")
    if proc.returncode != 0:
        raise AssertionError(f"gpushim-analyze {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


class Corpus(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gpushim-corpus-")
        cls.traces = {}
        cls.gpu_traces = {}
        for gz in sorted(glob.glob(os.path.join(CORPUS, "*.trace.gz"))):
            name = os.path.basename(gz)[:-len(".trace.gz")]
            path = os.path.join(cls.tmp, name + ".trace")
            with gzip.open(gz) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            (cls.gpu_traces if name in GPU_TRACES else cls.traces)[name] = path

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_corpus_has_every_kind_of_job(self):
        self.assertEqual(set(self.traces), MODELS)
        self.assertEqual(set(self.gpu_traces), set(GPU_TRACES))

    def test_the_gpu_time_model_reproduces_the_gpu_runs(self):
        # Under its recorded policy, --gpu-time model (no recorded fence outcome replayed, only the
        # device backlog estimated from them) gives the peak reserved the GPU run reported, within 3%.
        for name, path in self.gpu_traces.items():
            policy, reserved = GPU_TRACES[name]
            with self.subTest(trace=name):
                out = analyze_json("replay", path, "--policy", policy)
                self.assertEqual(out["gpu_time"], "model")
                d = out["policies"][0]["devices"][0]
                self.assertFalse(d["follows_recorded_reuse"])
                self.assertLess(abs(d["recorded_peak_reserved"] - reserved), MiB)  # the README's rounded figure
                self.assertLessEqual(abs(d["peak_reserved"] - reserved), 0.03 * reserved, d)
                if policy == "vmm" or name in SAME_POOLS:
                    self.assertIn("measured", d["backlog_source"])
                    self.assertNotIn("departed", d["backlog_source"])
                else:
                    # The calibration follows the run's numbered fences and events, and today's
                    # caching pool asks for far fewer events than the recording's did (it no longer
                    # records one to merge at each cudaFreeAsync): it departs from the run before its
                    # first sample, and the typical backlog stands in (still within 3% above). A
                    # trace that records when each fence and event was recorded would calibrate
                    # whatever the pool code (issue 27).
                    self.assertIn("departed from the run", d["backlog_source"])

    def test_a_gpu_run_replays_as_it_ran_under_the_pools_that_recorded_it(self):
        # The trace pins down what the pool saw on the GPU: when each fence and event completed
        # (reuse events) and where the driver put each segment (best fit breaks ties by address,
        # and an H200 hands large segments out downwards). Every block the size the run handed out.
        for name in sorted(SAME_POOLS):
            policy, _ = GPU_TRACES[name]
            with self.subTest(trace=name):
                out = analyze_json("replay", self.gpu_traces[name], "--policy", policy, "--gpu-time", "recorded")
                d = out["policies"][0]["devices"][0]
                self.assertTrue(d["follows_recorded_reuse"], d)
                self.assertEqual(d["first_difference_event"], 0, out["notes"])
                self.assertTrue(d["reproduces_recorded_peak"], d)
                self.assertFalse([n for n in out["notes"] if "under the recorded policy" in n], out["notes"])

    def test_every_trace_replays_under_every_policy(self):
        for name, path in self.traces.items():
            with self.subTest(trace=name):
                summary = analyze_json("summary", path)
                self.assertGreaterEqual(summary["iterations"], 8)  # a step mark per step
                out = analyze_json("replay", path)
                self.assertEqual(out["recorded_policy"], "passthrough")
                self.assertEqual(out["notes"], [])  # nothing cut short, dropped or unmatched
                by_policy = {p["policy"]: p for p in out["policies"]}
                self.assertLessEqual({"passthrough", "caching", "pytorch", "pytorch-expandable"}, set(by_policy))
                recorded = by_policy["passthrough"]["devices"][0]
                self.assertTrue(recorded["reproduces_recorded_peak"], recorded)
                self.assertGreater(recorded["allocs"], 5000)
                for policy, p in by_policy.items():
                    self.assertTrue(p["available"], policy)
                    d = p["devices"][0]
                    with self.subTest(policy=policy):
                        self.assertFalse(d["oom"])
                        self.assertEqual(d["allocs"], recorded["allocs"])
                        self.assertEqual(d["frees"], d["allocs"])  # every tensor was freed by the end
                        self.assertEqual(d["peak_requested"], recorded["recorded_peak_allocated"])
                        self.assertGreaterEqual(d["peak_allocated"], d["peak_requested"])
                        self.assertGreaterEqual(d["peak_reserved"], d["peak_allocated"])
                        # The listed calls are all of driver_calls.
                        self.assertEqual(sum(d[k] for k in DRIVER_CALL_KINDS), d["driver_calls"], d)
                # PyTorch's allocator synchronizes only to release memory: never on an unbounded device.
                for baseline in ("pytorch", "pytorch-expandable"):
                    d = by_policy[baseline]["devices"][0]
                    self.assertEqual(d["synchronizes"], 0, baseline)
                for policy, p in by_policy.items():  # the steady state is counted apart
                    d = p["devices"][0]
                    self.assertLessEqual(d["steady_state_synchronizes"], d["synchronizes"], policy)
                self.assertGreater(by_policy["pytorch"]["devices"][0]["segment_allocs"], 0)
                self.assertEqual(by_policy["pytorch-expandable"]["devices"][0]["segment_allocs"], 0)
                self.assertGreater(by_policy["pytorch-expandable"]["devices"][0]["maps"], 0)
                # No reuse moments (recorded on the CPU): the typical backlog, which --help states.
                source = by_policy["caching"]["devices"][0]["backlog_source"]
                self.assertTrue(source.startswith(f"typical: {TYPICAL_STEP_PERCENT}% of the median step"), source)

    def test_no_two_listed_sites_of_a_pytorch_run_read_alike(self):
        # Under PyTorch one Python line allocates through many operators: rows showing the same
        # frames said nothing to tell them apart ('train_step train.py:72' twice). Each now says
        # the folded frames where they part (`via`).
        def check(rows, what):
            seen = set()
            for r in rows:
                key = (r["device"], r.get("kind"), tuple(r["frames"]), tuple(r.get("via", ())))
                self.assertNotIn(key, seen, f"{what}: two rows read {key}")
                seen.add(key)
            return sum(1 for r in rows if r.get("via"))
        told = 0
        for name in ("h200_steptime_caching", "h200_transformer_caching"):
            with self.subTest(trace=name):
                out = analyze_json("summary", self.gpu_traces[name], "--top", "20")
                told += check(out["top_sites"], "top_sites") + check(out["at_peak_sites"], "at_peak_sites")
        out = analyze_json("diff", self.gpu_traces["h200_steptime_caching"], self.gpu_traces["h200_steptime_vmm"],
                           "--top", "20")
        told += check(out["sites"], "diff")
        self.assertGreater(told, 0)  # these runs do have such rows

    def test_help_states_the_typical_backlog_the_replay_uses(self):
        proc = subprocess.run([ANALYZE, "replay", "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"{TYPICAL_STEP_PERCENT}% of the median step", " ".join(proc.stdout.split()))

    def test_stream_ordered_replay_is_the_async_backend(self):
        # --stream-ordered re-issues the recorded plain frees as cudaFreeAsync on their stream (the
        # launcher's --torch-alloc async): the pools then order reuse by the free's event, not by a
        # device fence, and never synchronize on an unbounded device.
        path = self.traces["lstm_train"]
        plain = analyze_json("replay", path, "--policy", "caching", "--policy", "vmm")
        ordered = analyze_json("replay", path, "--policy", "caching", "--policy", "vmm", "--stream-ordered")
        for p, o in zip(plain["policies"], ordered["policies"]):
            with self.subTest(policy=p["policy"]):
                pd, od = p["devices"][0], o["devices"][0]
                self.assertEqual(od["allocs"], pd["allocs"])
                self.assertEqual(od["peak_requested"], pd["peak_requested"])
                self.assertEqual(pd["events_recorded"], 0)  # plain frees wait behind fences, not events
                self.assertGreater(pd["fence_waits"], 0)
                self.assertEqual(od["fence_waits"], 0)
                if p["policy"] == "vmm":
                    self.assertGreater(od["events_recorded"], 0)
                else:
                    # One stream: every free merges at once with its free neighbours under that
                    # stream's terms and is reused there, so the caching pool never needs an event.
                    self.assertEqual(od["events_recorded"], 0)
                self.assertEqual(od["synchronizes"], 0)
                self.assertFalse(od["oom"])

    def test_a_small_device_makes_pytorch_release_its_cache_and_retry(self):
        # The transformer's steps need 74 MiB under PyTorch's rules with nothing released; on a
        # 64 MiB device the allocator must free cached segments (or unmap free pages) and retry,
        # paying device synchronizations, as on a full GPU, and the job still fits.
        path = self.traces["transformer_train"]
        out = analyze_json("replay", path, "--policy", "pytorch", "--policy", "pytorch-expandable")
        for p in out["policies"]:
            self.assertGreater(p["devices"][0]["peak_reserved"], 64 * MiB)
        out = analyze_json("replay", path, "--policy", "pytorch", "--policy", "pytorch-expandable", "--capacity", "64MiB")
        pytorch, expandable = (p["devices"][0] for p in out["policies"])
        for d in (pytorch, expandable):
            self.assertFalse(d["oom"], d)
            self.assertLessEqual(d["peak_reserved"], 64 * MiB)
            self.assertGreater(d["synchronizes"], 0)
        self.assertGreater(pytorch["segment_frees"], 0)
        self.assertGreater(expandable["unmaps"], 0)

if __name__ == "__main__":
    unittest.main()
