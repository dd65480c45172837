"""End-to-end tests of gpushim-analyze on traces: a Python program's frames in every reading of
its trace, replays under a limit that refuse where the run was refused, and the exports viewers
read. Split from test_traces.py (the recording itself) so that these run under ASan, whose subject
the readers are, and the recording under TSan (tests/e2e/CMakeLists.txt)."""
import json
import os
import pickle
import re
import subprocess
import tempfile
import time
import unittest

from pythons import interpreters
from shimtest import POLICIES, ShimTestCase, program, run
from test_python_stacks import markers
from test_traces import ANALYZE, LEAK_PY, MiB, PLOT, analyze, analyze_json, check_memory_viz, load_memory_viz, \
    require_plot_python, traced


class PythonFrames(ShimTestCase):
    """A trace of a Python program carries the Python frames the report shows, and every reading of
    the trace (summary, folded stacks, memory-viz) names their file and line."""
    STEPS = 6

    @classmethod
    def setUpClass(cls):
        cls.lines = markers(LEAK_PY)
        cls.run_py, cls.trace = traced([interpreters()[0][0], LEAK_PY, str(cls.STEPS)])
        cls.out = tempfile.mkdtemp(prefix="gpushim-pyframes-")

    def folded(self, source):
        """{chain of Python frames, outermost first: weight} from a folded export of `source`."""
        out = os.path.join(self.out, "stacks.folded")
        analyze("export", "--format", "folded", source, "-o", out, "--lines")
        chains = {}
        with open(out) as f:
            for line in f:
                stack, weight = line.rsplit(" ", 1)
                self.assertNotIn("<python frame", stack, "a Python frame the trace did not resolve")
                chain = tuple(fr for fr in stack.split(";") if fr.endswith(")") and "(planted_leak.py:" in fr)
                chains[chain] = chains.get(chain, 0) + int(weight)
        return chains

    def test_the_trace_has_the_reports_python_frames(self):
        self.assertRanOK(self.run_py)
        # From the report: each live site's Python frames, as the folded export writes them.
        expected = set()
        for site in self.run_py.report["sites"]:
            frames = [f for f in site["frames"] if f["kind"] == "python"]
            self.assertTrue(frames, site)
            expected.add(tuple(f"{f['function']} ({os.path.basename(f['file'])}:{f['line']})" for f in reversed(frames)))
        self.assertEqual(set(self.folded(self.run_py.report_path)), expected)
        # From the trace, weighed at the peak (the last step, its scratch buffer live): the same
        # chains, plus the scratch buffer's, which is no longer live at exit.
        at_peak = self.folded(self.trace)
        self.assertLessEqual(expected, set(at_peak))
        lines = self.lines
        by_line = {}  # (caller, allocating line): bytes at the peak
        for chain, weight in at_peak.items():
            by_line[chain[-2:]] = by_line.get(chain[-2:], 0) + weight
        main = f"main (planted_leak.py:{lines['step_call']})"
        self.assertEqual(by_line[(main, f"leaky_step (planted_leak.py:{lines['leak']})")], self.STEPS * MiB)
        self.assertEqual(by_line[(main, f"leaky_step (planted_leak.py:{lines['scratch']})")], 8 * MiB)
        weights = [w for chain, w in by_line.items() if chain[-1] == f"load_model (planted_leak.py:{lines['weights']})"]
        self.assertEqual(weights, [4 * 64 * MiB])

    def test_summary_of_the_trace_names_python_file_and_line(self):
        summary = analyze_json("summary", self.trace, "--frames", "64")
        self.assertTrue(summary["at_peak_sites"])
        frames = [f for part in ("top_sites", "at_peak_sites") for s in summary[part] for f in s["frames"]]
        for function, tag in (("leaky_step", "leak"), ("leaky_step", "scratch"), ("load_model", "weights"),
                              ("main", "step_call")):
            self.assertIn(f"{function} planted_leak.py:{self.lines[tag]}", frames)
        self.assertFalse([f for f in frames if f.startswith("<python frame")], frames)
        text = analyze("summary", self.trace).stdout
        self.assertIn(f"planted_leak.py:{self.lines['weights']}", text)

    def test_memory_viz_frames_have_python_file_and_line(self):
        out = os.path.join(self.out, "snap.pickle")
        analyze("export", "--format", "memory-viz", self.trace, "-o", out)
        snap = load_memory_viz(self, out)
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        leak_line = self.lines["leak"]
        leaks = [e for e in allocs if {"filename": LEAK_PY, "line": leak_line, "name": "leaky_step"} in e["frames"]]
        self.assertEqual(len(leaks), self.STEPS, [e["frames"] for e in allocs[:3]])


    def test_sites_are_named_by_the_programs_own_line(self):
        # replay's OOM site, the perfetto-json OOM instant's "site", the timeline's growth sites and
        # summary --site's function took the innermost frame outside the shim: under ctypes
        # "libffi.so.8+0x6f7a", where summary, diff and merge named the Python line.
        r, trace = traced([interpreters()[0][0], LEAK_PY, "2"], env={"GPUSHIM_LIMIT": "200MiB"})
        self.assertEqual(len(r.report["ooms"]), 1, r.stderr)
        weights = "load_model planted_leak.py:%d" % self.lines["weights"]
        dev = analyze_json("replay", trace, "--policy", "caching")["policies"][0]["devices"][0]
        self.assertEqual(dev["oom_site"], weights)
        out = os.path.join(self.out, "oom.json")
        analyze("export", "--format", "perfetto-json", trace, "-o", out)
        with open(out) as f:
            ooms = [e for e in json.load(f)["traceEvents"] if e["name"].startswith("OOM")]
        self.assertEqual([e["args"]["site"] for e in ooms], [weights])
        self.assertEqual(analyze("summary", "--site", "1", self.trace).stdout.splitlines()[1],
                         "  load_model planted_leak.py")
        _, marked = traced([interpreters()[0][0], LEAK_PY, "20", "marks"])
        analyze("export", "--format", "timeline", marked, "-o", out)
        with open(out) as f:
            growth = json.load(f)["growth"]
        self.assertEqual([g["site"] for g in growth], ["leaky_step planted_leak.py:%d" % self.lines["leak"]])


class ReplayUnderALimit(ShimTestCase):
    def test_a_long_site_name_keeps_each_row_on_its_line(self):
        # A row was formatted into 512 bytes: an OOM site past that (a C++ template, a long Python
        # name) cut the row and its newline, and every policy's row ran into one line.
        workdir = tempfile.mkdtemp(prefix="gpushim-long-")
        script = os.path.join(workdir, "long_name.py")
        name = "allocate_" + "x" * 600
        with open(script, "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {os.path.dirname(LEAK_PY)!r})\n"
                    "import ctypes\nfrom cuda_ctypes import MiB, cuda\n"
                    f"def {name}():\n    p = ctypes.c_void_p()\n    return cuda.cudaMalloc(ctypes.byref(p), 64 * MiB)\n"
                    f"print([{name}() for _ in range(4)])\n")
        r, trace = traced([interpreters()[0][0], script], env={"GPUSHIM_LIMIT": "150MiB"})
        self.assertEqual(len(r.report["ooms"]), 2, r.stderr)
        lines = analyze("replay", trace, "--policy", "caching", "--policy", "vmm").stdout.splitlines()
        rows = [l for l in lines if l.startswith(("caching ", "vmm "))]
        self.assertEqual(len(rows), 2, lines)
        for row in rows:
            self.assertIn("yes: event ", row)
            self.assertTrue(row.endswith(f"({name} long_name.py:7); 2 refused in all"), row[-100:])

    def test_oom_is_reported_at_the_right_event(self):
        # Ten 64 MiB blocks, then ten frees: under a 200 MiB cap the 4th allocation is refused.
        r, path = traced([program("e2e_cap_and_oom"), "64", "10"], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        for policy in POLICIES:
            with self.subTest(policy=policy):
                out = analyze_json("replay", path, "--policy", policy, "--limit", "200MiB")
                dev = out["policies"][0]["devices"][0]
                self.assertTrue(dev["oom"])
                self.assertEqual(dev["oom_event"], 4)
                self.assertEqual(dev["oom_requested"], 64 * MiB)
                self.assertEqual(dev["oom_allocated"], 3 * 64 * MiB)
                self.assertEqual(dev["ooms"], 7)  # the 4th to 10th
                self.assertIn("cap_and_oom.cpp", dev["oom_site"])
                self.assertFalse(analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")["policies"][0]["devices"][0]["oom"])
        text = analyze("replay", path, "--limit", "200MiB").stdout
        self.assertIn("yes: event 4", text)

    def test_replay_as_recorded_gives_the_same_refusals_and_peak(self):
        # A library's driver-API memory shares the cap with the program's cudaMalloc: the replay
        # under the recorded policy and cap must refuse exactly what the run was refused.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_cap_and_oom"), "64", "10", "100"],
                                 env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "300MiB"})
                self.assertRanOK(r)
                self.assertEqual(len(r.report["ooms"]), 1)
                out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                dev = out["policies"][0]["devices"][0]
                self.assertEqual((dev["recorded_ooms"], dev["ooms"], dev["recorded_ooms_avoided"]), (1, 1, 0), dev)
                self.assertEqual(dev["first_difference_event"], 0)
                self.assertTrue(dev["reproduces_recorded_peak"], dev)
                self.assertFalse([n for n in out["notes"] if "departs" in n], out["notes"])

    def test_a_recorded_oom_replays_where_it_happened(self):
        # Recorded under passthrough (pooled recordings: test_a_pooled_oom_replays_where_it_happened).
        r, path = traced([program("e2e_train_loop"), "100", "--leak-mib", "6"],
                         env={"GPUSHIM_LIMIT": "400MiB", "GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        self.assertGreaterEqual(json.loads(r.stdout.splitlines()[0])["oom_at"], 0)
        summary = analyze_json("summary", path)
        self.assertEqual(len(summary["ooms"]), 1)
        self.assertEqual(summary["ooms"][0]["requested"], r.report["ooms"][0]["requested"])
        replayed = analyze_json("replay", path, "--policy", "passthrough")["policies"][0]["devices"][0]
        self.assertTrue(replayed["oom"])
        self.assertEqual(replayed["recorded_ooms"], 1)
        self.assertEqual(replayed["recorded_ooms_avoided"], 0)
        self.assertEqual(replayed["oom_requested"], r.report["ooms"][0]["requested"])
        # Growth is the exit report's own verdict (report/growth_verdict.h), replayed from the
        # trace: the program frees its leak once the OOM ends the loop, so at exit nothing grew.
        self.assertEqual((summary["growth_verdict"], summary["growth_evidence"]),
                         (r.report["growth"]["verdict"], r.report["growth"]["evidence"]))
        self.assertEqual(len(summary["growth"]), len(r.report["growth"]["suspects"]))
        self.assertFalse(any("load_model" in g["frames"][0] for g in summary["growth"]))
        # With a larger cap the refused request would have fit.
        bigger = analyze_json("replay", path, "--policy", "passthrough", "--limit", "2GiB")["policies"][0]["devices"][0]
        self.assertFalse(bigger["oom"])
        self.assertEqual(bigger["recorded_ooms_avoided"], 1)

    def test_a_pooled_oom_replays_where_it_happened(self):
        # Under a pool the refusal depends on where freed blocks were placed, which depends on when
        # the device finished with them: the trace records when the pool saw each fence complete,
        # and the replay under the recorded policy and cap follows it to the same refusal.
        for policy in [p for p in POLICIES if p != "passthrough"]:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_train_loop"), "100", "--leak-mib", "6"],
                                 env={"GPUSHIM_LIMIT": "400MiB", "GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                self.assertEqual(len(r.report["ooms"]), 1)
                out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                dev = out["policies"][0]["devices"][0]
                self.assertTrue(dev["follows_recorded_reuse"], dev)
                self.assertEqual((dev["recorded_ooms"], dev["ooms"], dev["recorded_ooms_avoided"]), (1, 1, 0), dev)
                self.assertEqual(dev["first_difference_event"], 0)
                self.assertEqual(dev["oom_requested"], r.report["ooms"][0]["requested"])
                self.assertTrue(dev["reproduces_recorded_peak"], dev)

    def test_a_driver_that_hands_memory_out_downwards_replays_exactly(self):
        # A pool breaks ties between equal free blocks by address, and a GPU's driver need not hand
        # memory out at rising addresses as the replay's simulated device does (an H200 hands a
        # caching pool's large segments out downwards): the replay puts each segment where the
        # trace says the run's driver put it, and so follows the run to the same refusal.
        for policy in [p for p in POLICIES if p != "passthrough"]:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_train_loop"), "100", "--leak-mib", "6"],
                                 env={"GPUSHIM_LIMIT": "400MiB", "GPUSHIM_POLICY": policy,
                                      "FAKECUDA_ALLOC_ORDER": "down", "FAKECUDA_KERNEL_US": "200"})
                self.assertRanOK(r)
                self.assertEqual(len(r.report["ooms"]), 1)
                out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                dev = out["policies"][0]["devices"][0]
                self.assertEqual(dev["first_difference_event"], 0, out["notes"])
                self.assertEqual((dev["recorded_ooms"], dev["ooms"], dev["recorded_ooms_avoided"]), (1, 1, 0), dev)
                self.assertTrue(dev["reproduces_recorded_peak"], dev)
                self.assertFalse([n for n in out["notes"] if "departs" in n], out["notes"])


class Exports(ShimTestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_caching, cls.trace_caching = traced([program("e2e_train_loop"), "8"], env={"GPUSHIM_POLICY": "caching"})
        cls.run_pass, cls.trace_pass = traced([program("e2e_leak_two_sites")], env={"GPUSHIM_POLICY": "passthrough"})
        cls.out = tempfile.mkdtemp(prefix="gpushim-export-")

    def test_memory_viz_from_traces_keeps_the_viewers_invariants(self):
        for trace in (self.trace_caching, self.trace_pass):
            with self.subTest(trace=trace):
                out = os.path.join(self.out, "snap.pickle")
                analyze("export", "--format", "memory-viz", trace, "-o", out)
                snap = load_memory_viz(self, out)
                check_memory_viz(self, snap)
                allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
                frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
                summary = analyze_json("summary", trace)["devices"][0]
                self.assertEqual(len(allocs), summary["total_allocs"])
                self.assertEqual(len(frees), summary["total_frees"])
                live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
                self.assertEqual(live, summary["live_bytes"])
                self.assertTrue(any(f["name"].startswith(("leak_from", "(anonymous namespace)::leaky_step"))
                                    for e in allocs for f in e["frames"]))
                # Every segment carries the stack of the allocation that made the pool take it, as
                # PyTorch's do (memory_viz: not "allocated before _record_history was enabled").
                segs = [e for e in snap["device_traces"][0] if e["action"] in ("segment_alloc", "segment_map")]
                self.assertTrue(segs)
                self.assertEqual([e for e in segs if not e["frames"]], [])

    def test_memory_viz_lays_out_the_memory_handles_key(self):
        # CUDA arrays are recorded under their handles' keys, which lie bytes apart: laid out there,
        # each array overlapped the one before, which the export took for a lost free (four
        # "inconsistencies", two "frees of unknown blocks", the live arrays missing).
        for policy in ("passthrough", "caching"):
            with self.subTest(policy=policy):
                _, trace = traced([program("e2e_cuda_arrays")], env={"GPUSHIM_POLICY": policy})
                out = os.path.join(self.out, "arrays.pickle")
                p = analyze("export", "--format", "memory-viz", trace, "-o", out)
                self.assertNotIn("note:", p.stderr)
                snap = load_memory_viz(self, out)
                check_memory_viz(self, snap)
                summary = analyze_json("summary", trace)["devices"][0]
                events = snap["device_traces"][0]
                self.assertEqual(len([e for e in events if e["action"] == "alloc"]), summary["total_allocs"])
                self.assertEqual(len([e for e in events if e["action"] == "free_completed"]), summary["total_frees"])
                live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
                self.assertEqual(len(live), 3)
                self.assertEqual(sum(b["size"] for b in live), summary["live_bytes"])
                # Below 2^53: the viewer's JavaScript holds every address exactly.
                self.assertLess(max(e["addr"] + e["size"] for e in events), 1 << 53)

    def test_memory_viz_from_a_report_has_one_block_per_live_site(self):
        out = os.path.join(self.out, "report.pickle")
        analyze("export", "--format", "memory-viz", self.run_pass.report_path, "-o", out)
        snap = load_memory_viz(self, out)
        check_memory_viz(self, snap, expect_history=False)
        self.assertEqual(snap["device_traces"], [[]])
        sizes = sorted(b["size"] for s in snap["segments"] for b in s["blocks"])
        self.assertEqual(sizes, sorted(s["live_bytes"] for s in self.run_pass.report["sites"]))

    def test_folded_stacks_parse_and_add_up(self):
        out = os.path.join(self.out, "stacks.folded")
        analyze("export", "--format", "folded", self.run_pass.report_path, "-o", out)
        with open(out) as f:
            lines = f.read().splitlines()
        total = 0
        for line in lines:
            m = re.fullmatch(r"(.+) (\d+)", line)
            self.assertIsNotNone(m, line)
            frames = m.group(1).split(";")
            self.assertTrue(all(frames), line)
            self.assertNotIn("cudaMalloc", m.group(1))  # the shim's own frames are left out
            total += int(m.group(2))
        self.assertEqual(total, sum(s["live_bytes"] for s in self.run_pass.report["sites"]))
        self.assertTrue(lines[0].startswith("_start;"), lines[0])  # outermost first
        # From a trace, weighed at the peak: the temporary 64 MiB buffer dominates.
        analyze("export", "--format", "folded", self.trace_pass, "-o", out)
        with open(out) as f:
            weights = {l.rsplit(" ", 1)[0].split(";")[-1].split(" (")[0]: int(l.rsplit(" ", 1)[1]) for l in f}
        self.assertEqual(weights["temporary_work()"], 64 * MiB)

    def test_perfetto_json_has_counter_tracks_that_reach_the_peak(self):
        out = os.path.join(self.out, "trace.json")
        analyze("export", "--format", "perfetto-json", self.trace_caching, "-o", out)
        with open(out) as f:
            doc = json.load(f)
        counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
        # Two counters of one value each: Chrome's viewer stacks the values of one counter.
        by_name = {}
        for e in counters:
            what = e["name"].rsplit(" ", 1)[1]
            self.assertEqual(set(e["args"]), {what}, e)
            by_name.setdefault(e["name"], []).append((e["ts"], e["args"][what]))
        self.assertEqual(set(by_name), {"device 0 allocated", "device 0 reserved"})
        allocated, reserved = by_name["device 0 allocated"], by_name["device 0 reserved"]
        self.assertEqual([t for t, _ in allocated], [t for t, _ in reserved])
        for (t, a), (_, r) in zip(allocated, reserved):
            self.assertLessEqual(a, r, t)
        ts = [t for t, _ in allocated]
        self.assertTrue(ts)
        self.assertEqual(ts, sorted(ts))
        summary = analyze_json("summary", self.trace_caching)["devices"][0]
        self.assertEqual(max(v for _, v in allocated), summary["peak_allocated"])
        self.assertEqual(max(v for _, v in reserved), summary["peak_reserved"])
        self.assertTrue(any(e["ph"] == "M" and e["name"] == "process_name" for e in doc["traceEvents"]))
        # A report's sampled timeline exports too.
        analyze("export", "--format", "perfetto-json", self.run_caching.report_path, "-o", out)
        with open(out) as f:
            self.assertIn("traceEvents", json.load(f))

    def test_a_few_points_asked_gives_a_few_points_with_the_peak(self):
        # --max-points 1 to 3 gave every point (thinning began at 4), not about as many as asked.
        peak = analyze_json("summary", self.trace_caching)["devices"][0]["peak_allocated"]
        out = os.path.join(self.out, "few.json")
        everything = None
        for n in ("0", "1", "2", "3", "4"):
            with self.subTest(max_points=n):
                analyze("export", "--format", "timeline", "--max-points", n, self.trace_caching, "-o", out)
                with open(out) as f:
                    samples = json.load(f)["devices"][0]["samples"]
                if n == "0":
                    everything = len(samples)
                    self.assertGreater(everything, 20)
                    continue
                self.assertLessEqual(len(samples), 5)
                self.assertEqual(max(s[1] for s in samples), peak)

    def test_plot_draws_reports_and_traces(self):
        require_plot_python()
        for source in (self.trace_caching, self.run_caching.report_path):
            with self.subTest(source=source):
                png = os.path.join(self.out, "plot.png")
                if os.path.exists(png):
                    os.unlink(png)
                proc = subprocess.run([PLOT, source, "-o", png], capture_output=True, text=True, timeout=120,
                                      env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
                self.assertEqual(proc.returncode, 0, proc.stderr)
                with open(png, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
                self.assertGreater(os.path.getsize(png), 10000)
        proc = subprocess.run([PLOT, ANALYZE, "-o", os.path.join(self.out, "x.png")], capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(proc.returncode, 1)
        self.assertTrue(proc.stderr.startswith("gpushim-plot: "), proc.stderr)

    def test_every_subcommand_has_help(self):
        for cmd in ("summary", "replay", "diff", "merge", "export"):
            p = analyze(cmd, "--help")
            self.assertIn(f"usage: gpushim-analyze {cmd}", p.stdout)
        self.assertIn("commands:", analyze("--help").stdout)
        self.assertEqual(analyze("frobnicate", check=False).returncode, 2)
        self.assertEqual(analyze("replay", "--bogus", check=False).returncode, 2)


if __name__ == "__main__":
    unittest.main()
