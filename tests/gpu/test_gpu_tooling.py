"""What of the GPU validation suite can be checked without a GPU: scripts/gpu-validate skips cleanly and
says why, reads results and plans its budget right, says why a child failed, and the kernel library
built with nvcc has the contract the e2e programs rely on. (The bundle, and gpu-validate run from it on
the simulated device: test_bundle.py.)"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from tooling_env import HERE, ROOT, BUILD, clean_env, sanitizer_build

MiB = 1 << 20


class GpuValidateWithoutGpu(unittest.TestCase):
    def run_validate(self, **env):
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu-validate"), "--build-dir", BUILD,
                               "--no-build"], env=clean_env(**env), capture_output=True, text=True, timeout=120)

    def test_no_visible_gpu_is_a_clean_skip(self):
        proc = self.run_validate(CUDA_VISIBLE_DEVICES="")
        self.assertEqual(proc.returncode, 77, proc.stdout + proc.stderr)
        self.assertIn(f"running from the source tree {ROOT}, build {BUILD}", proc.stderr)
        self.assertRegex(proc.stdout, r"^SKIPPED: gpu-validate needs an NVIDIA GPU: ")
        self.assertNotIn("Traceback", proc.stderr)

    @unittest.skipIf(sanitizer_build(), "the simulated driver of a sanitizer build needs the sanitizer runtime, "
                                        "which this Python process does not carry")
    def test_simulated_driver_is_not_taken_for_a_gpu(self):
        proc = self.run_validate(LD_LIBRARY_PATH=os.path.join(BUILD, "fakecuda"))
        self.assertEqual(proc.returncode, 77, proc.stdout + proc.stderr)
        self.assertIn("is the simulated device, not NVIDIA's driver", proc.stdout)


def load_gpu_validate():
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("gpu_validate", os.path.join(ROOT, "scripts", "gpu-validate"))
    spec = importlib.util.spec_from_loader("gpu_validate", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class Verdicts(unittest.TestCase):
    """How gpu-validate reads runs and reports, and plans its time."""

    @classmethod
    def setUpClass(cls):
        cls.gv = load_gpu_validate()

    def test_losses_identical_or_how_far_apart(self):
        self.assertEqual(self.gv.compare_losses([1.5, 2.25], [1.5, 2.25]), "identical")
        self.assertEqual(self.gv.compare_losses([1.5, 2.0], [1.5, 2.25]), "differs: max |Δ| 0.25")
        self.assertIn("different length", self.gv.compare_losses([1.0], [1.0, 2.0]))

    def test_top_suspect_at_the_jobs_own_frame(self):
        rep = {"growth": {"verdict": "growing", "evidence": "", "iterations": 60, "iteration_source": "train_step",
                          "suspects": [{"bytes_per_iteration": 2 * MiB, "frames": [
                              {"function": "clone", "file": "", "line": 0},
                              {"function": "train_step", "file": "/b/tests/gpu/train.py", "line": 71},
                              {"function": "main", "file": "/b/tests/gpu/train.py", "line": 99}]},
                              {"bytes_per_iteration": 1, "frames": []}]}}
        file, line, how = self.gv.top_suspect(rep, "train.py")
        self.assertEqual((file, line), ("/b/tests/gpu/train.py", 71))
        self.assertIn("2.00 MiB per iteration, 2 suspect(s); growth verdict: growing; 60 iterations (train_step)", how)
        file, line, how = self.gv.top_suspect({"growth": {"verdict": "not judged", "evidence": "4 iterations, 8 needed",
                                                          "suspects": []}}, "train.py")
        self.assertIsNone(file)
        self.assertIn("no growth suspect; growth verdict: not judged (4 iterations, 8 needed)", how)
        self.assertEqual(self.gv.top_suspect({}, "train.py")[2], "the report has no growth section")

    def test_planted_line_is_the_marked_one(self):
        path = os.path.join(HERE, "train.py")
        n = self.gv.planted_line(path)
        with open(path) as f:
            self.assertIn("kept.append(", f.read().splitlines()[n - 1])

    def test_plan_keeps_parts_in_order_while_they_fit_and_says_what_it_skipped(self):
        est = {"micro": 50, "leak": 40, "steptime": 210, "e2e": 90, "workloads": 40}
        # leak and workloads run beside e2e: together they cost what the longer side takes.
        kept, skipped = self.gv.plan(self.gv.PARTS, 360, est, {})
        self.assertEqual([p for p, _ in kept], ["micro", "leak", "steptime", "e2e", "workloads"])
        self.assertEqual(skipped, [])
        kept, skipped = self.gv.plan(self.gv.PARTS, 350, est, {})
        self.assertEqual([p for p, _ in kept], ["micro", "leak", "steptime", "workloads"])
        self.assertEqual(skipped, [("e2e", "needs ~90 s, 40 s of the 350 s budget left")])
        kept, skipped = self.gv.plan(["micro", "steptime", "e2e"], 120, est, {"steptime": "no torch"})
        self.assertEqual(kept, [("micro", 50)])
        self.assertEqual(skipped, [("steptime", "no torch"), ("e2e", "needs ~90 s, 60 s of the 120 s budget left")])

    def test_the_default_suite_fits_540_s_on_the_recorded_gpu_timings(self):
        import argparse
        est = self.gv.estimates(argparse.Namespace(reps=5), simulated=False)
        kept, skipped = self.gv.plan(self.gv.PARTS, 540, est, {})
        self.assertEqual(skipped, [])
        self.assertLessEqual(self.gv.MARGIN + self.gv.planned_seconds([p for p, _ in kept], est), 530)
        # Timed parts alone, one after the other; then the e2e modules with the others beside them.
        self.assertEqual(self.gv.stages(kept), [["micro"], ["steptime"], ["e2e", "leak", "workloads"]])
        self.assertEqual(self.gv.plan_text(kept, est),
                         "micro (~15 s), steptime (~300 s), e2e (~200 s) with leak (~35 s) then workloads (~40 s) "
                         "beside it; ~525 s in all")
        # While steptime runs, the last stage keeps the leak's time (and more than e2e's floor).
        self.assertEqual(self.gv.reserve(["e2e", "leak", "workloads"], est), 35)

    def test_e2e_modules_start_longest_first(self):
        import argparse
        suite = self.gv.Suite(argparse.Namespace(simulated=True, e2e_modules=None), BUILD, None, None, None)
        shutil.rmtree(suite.work, ignore_errors=True)
        order = suite.e2e_modules()
        self.assertEqual(order[:4], ["test_device_reset", "test_every_allocation", "test_exit_paths", "test_fork"])
        source_only = {"test_hook_table", "test_docs_match_help"}  # they read the source tree
        self.assertFalse(source_only & set(order))
        self.assertEqual(sorted(order), sorted(os.path.basename(f)[:-3] for f in
                                               os.listdir(os.path.join(ROOT, "tests", "e2e"))
                                               if f.startswith("test_") and f.endswith(".py") and f[:-3] not in source_only))

    def test_step_table_median_iqr_and_ratios_paired_by_round(self):
        recs = []
        for rnd, (native, shim) in enumerate([(10.0, 10.5), (12.0, 12.0), (11.0, 11.55), (10.0, 10.0), (10.0, 11.0)], 1):
            for label, ms in (("native", native), ("launcher --policy vmm", shim)):
                recs.append({"part": "steptime", "status": "pass", "config": label, "round": rnd, "step_ms": ms,
                             "peak_bytes": 100 * MiB, "torch_max_reserved": 80 * MiB, "final_loss": 2.0})
        text = self.gv.step_table(recs)
        row = [l for l in text.splitlines() if l.startswith("| launcher --policy vmm |")][0]
        # ratios 1.05, 1.0, 1.05, 1.0, 1.1: median 1.05, quartiles 1.0 and 1.05
        self.assertIn("| 5 | 11.00 ms (IQR 10.50 ms–11.55 ms) | 1.050× (IQR 1.000×–1.050×) | 100 MiB (IQR 100 MiB–100 MiB) |",
                      row)

    def test_a_failure_always_says_why(self):
        support = sys.modules["validate_support"]
        tmp = tempfile.mkdtemp(prefix="gpushim-validate-test-")
        try:
            o = support.run_child(["sh", "-c", "echo first >&2; echo last words >&2; kill -SEGV $$"], clean_env(), 30,
                                  os.path.join(tmp, "segv"))
            self.assertFalse(o.ok)
            self.assertEqual(o.describe(), "killed by signal SIGSEGV; last lines: first / last words")
            o = support.run_child(["sh", "-c", "exit 3"], clean_env(), 30, os.path.join(tmp, "quiet"))
            self.assertEqual(o.describe(), "exit status 3; it printed nothing")
            o = support.run_child(["sh", "-c", "echo waiting; sleep 30"], clean_env(), 1, os.path.join(tmp, "slow"))
            self.assertEqual(o.describe(), "timed out after 1 s (killed); last lines: waiting")
            o = support.run_child([os.path.join(tmp, "missing")], clean_env(), 30, os.path.join(tmp, "missing"))
            self.assertRegex(o.describe(), r"^exit status 127; last lines: could not start .*missing: ")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class TorchPartsWithStandInRuns(unittest.TestCase):
    """The PyTorch parts run only on a GPU: here their children are stood in for (run_child replaced)
    so that the commands they build, the order of the runs and what they record are checked."""

    def setUp(self):
        import argparse
        self.gv = load_gpu_validate()
        self.tmp = tempfile.mkdtemp(prefix="gpushim-validate-test-")
        self.calls = []
        support = sys.modules["validate_support"]
        self.gv.run_child = self.fake_run
        results = support.Results(os.path.join(self.tmp, "out"), ["# test"], self.gv.render)
        args = argparse.Namespace(simulated=False, reps=5)
        self.suite = self.gv.Suite(args, BUILD, None, "/nvidia/lib", results)
        self.outcome = support.Outcome

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def fake_run(self, cmd, env, timeout, log_base, cwd=None):
        self.calls.append((cmd, env))
        for path in (log_base + ".out", log_base + ".err"):
            open(path, "w").close()
        out = cmd[cmd.index("--out") + 1]
        rnd = int(out.rsplit("-", 1)[-1].split(".")[0]) if "step-" in out else 1
        step = 10.0 + rnd / 10 + (0.5 if "--policy" in cmd else 0)
        with open(out, "w") as f:
            json.dump({"median_step_ms": step, "losses": [3.0, 2.5], "torch_max_reserved": 64 * MiB}, f)
        report = cmd[cmd.index("--report") + 1] if "--report" in cmd else env.get("GPUSHIM_REPORT")
        if "--leak" in cmd:
            line = self.gv.planted_line(os.path.join(HERE, "train.py"))
            with open(report, "w") as f:
                json.dump({"growth": {"verdict": "growing", "iterations": 60, "iteration_source": "train_step",
                                      "suspects": [{"bytes_per_iteration": 2 * MiB, "frames": [
                                          {"file": "/x/tests/gpu/train.py", "line": line if "run" in cmd else line + 1}]}]}},
                          f)
        return self.outcome(0, False, 1.0, log_base + ".out", log_base + ".err", timeout)

    def test_steptime_interleaves_five_configurations_five_times(self):
        self.suite.steptime(time.monotonic() + 600)
        order = []
        for cmd, env in self.calls:
            self.assertNotIn("/nvidia/lib", env["LD_LIBRARY_PATH"].split(":"))
            self.assertEqual(cmd[cmd.index("--steps") + 1:cmd.index("--steps") + 4], ["24", "--warmup", "8"])
            if cmd[0] == sys.executable:
                order.append(env.get("PYTORCH_CUDA_ALLOC_CONF", "native"))
                self.assertNotIn("LD_PRELOAD", env)
            else:
                self.assertEqual(cmd[:2], [os.path.join(BUILD, "bin", "gpushim"), "run"])
                self.assertIn("--trace", cmd)
                self.assertEqual(cmd[cmd.index("--") + 1:cmd.index("--") + 3], [sys.executable, os.path.join(HERE, "train.py")])
                order.append(" ".join(cmd[2:cmd.index("--summary")]) or "launcher")
        self.assertEqual(order, ["native", "expandable_segments:True", "backend:cudaMallocAsync", "launcher",
                                 "--policy vmm"] * 5)
        records = self.suite.results.records
        self.assertEqual(len(records), 25)
        table = self.gv.step_table(records)
        self.assertIn("| launcher --policy vmm | 5 | 10.80 ms (IQR 10.70 ms–10.90 ms) | 1.049× (IQR 1.048×–1.049×) |", table)
        self.assertIn("| launcher default (caching) | 5 | 10.30 ms (IQR 10.20 ms–10.40 ms) | 1.000× ", table)
        self.assertIn("| native | 5 | 10.30 ms (IQR 10.20 ms–10.40 ms) | 1 |", table)
        self.assertIn("tests/gpu/train.py, 24 steps, the first 8 left out", table)

    def test_leak_and_workloads_run_beside_the_e2e_modules_in_order(self):
        import threading
        spans, lock = {}, threading.Lock()

        def part(name, seconds):
            def run(deadline):
                t0 = time.monotonic()
                time.sleep(seconds)
                with lock:
                    spans[name] = (t0, time.monotonic(), deadline)
            return run
        self.suite.e2e, self.suite.leak, self.suite.workloads = part("e2e", 0.6), part("leak", 0.2), part("workloads", 0.2)
        deadline = time.monotonic() + 60
        self.suite.together(["e2e", "leak", "workloads"], deadline)
        self.assertEqual(sorted(spans), ["e2e", "leak", "workloads"])
        self.assertTrue(all(d == deadline for _, _, d in spans.values()))
        self.assertLess(spans["leak"][0], spans["e2e"][1])           # beside e2e, not after it
        self.assertGreaterEqual(spans["workloads"][0], spans["leak"][1])  # one after the other
        self.assertLess(spans["workloads"][1], spans["e2e"][1] + 0.5)

    def test_workloads_compare_the_launchers_run_with_natives(self):
        self.suite.workloads(time.monotonic() + 600)
        native, launcher = self.calls[0][0], self.calls[1][0]
        self.assertEqual(native[:3], [sys.executable, os.path.join(HERE, "torch_workloads.py"), "multistream"])
        self.assertEqual(launcher[:2], [os.path.join(BUILD, "bin", "gpushim"), "run"])
        self.assertEqual(launcher[launcher.index("--") + 1:][:3], native[:3])
        self.assertEqual([(r["name"], r["status"], r["result"]) for r in self.suite.results.records],
                         [("multistream", "pass", "checksums/losses vs native: identical"),
                          ("graph", "pass", "checksums/losses vs native: identical")])

    def test_leak_part_reports_the_top_suspect_against_the_planted_line(self):
        self.suite.leak(time.monotonic() + 600)
        (preload_cmd, preload_env), (launcher_cmd, _) = self.calls
        self.assertEqual(preload_cmd[0], sys.executable)  # the mission's command: no launcher
        self.assertEqual(preload_env["LD_PRELOAD"], os.path.join(BUILD, "lib", "libgpushim.so"))
        self.assertNotIn("GPUSHIM_POLICY", preload_env)
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", preload_env)
        # PyTorch loads its own wheel's CUDA libraries, as in users' jobs; NVIDIA's runtime folder is
        # only for the programs built here.
        self.assertNotIn("/nvidia/lib", preload_env["LD_LIBRARY_PATH"].split(":"))
        line = self.gv.planted_line(os.path.join(HERE, "train.py"))
        preload, launcher = self.suite.results.records
        self.assertEqual((preload["config"], preload["status"]), ("LD_PRELOAD (no launcher)", "fail"))
        self.assertEqual(preload["message"], f"top suspect train.py:{line + 1}, not train.py:{line}; 2.00 MiB per "
                                             "iteration, 1 suspect(s); growth verdict: growing; 60 iterations (train_step)")
        self.assertEqual((launcher["config"], launcher["status"], launcher["top_suspect"]),
                         ("launcher default", "pass", f"/x/tests/gpu/train.py:{line}"))


@unittest.skipIf(sanitizer_build(), "the GPU suite runs release builds; sanitizer builds do not build the benchmarks")
class NvidiaRuntimeLinkage(unittest.TestCase):
    """The programs the GPU suite runs are the ones built here, linked to the simulated libcudart: on a
    GPU they must bind to NVIDIA's libcudart.so.13 unchanged. Where NVIDIA's runtime is installed (the
    toolkit is, on the build machines), check that every symbol and symbol version resolves."""

    def test_programs_and_kernels_resolve_against_nvidias_libcudart(self):
        cudart = load_gpu_validate().find_cudart_dir()
        if cudart is None:
            self.skipTest("NVIDIA's libcudart.so.13 is not installed here")
        import glob
        binaries = sorted(glob.glob(os.path.join(BUILD, "bin", "e2e_*")))
        binaries += [os.path.join(BUILD, "bin", f"gpushim_bench_{n}") for n in ("alloc", "fragmentation", "host_memory")]
        kernels = os.path.join(BUILD, "gpu", "libgpushim_testkernels.so")
        if os.path.exists(kernels):
            binaries.append(kernels)
        self.assertGreater(len(binaries), 5)
        for b in binaries:
            out = subprocess.run(["ldd", "-r", b], env=clean_env(LD_LIBRARY_PATH=cudart), capture_output=True,
                                 text=True).stdout + "\n"
            with self.subTest(binary=os.path.basename(b)):
                needed = subprocess.run(["readelf", "-dW", b], capture_output=True, text=True, check=True).stdout
                # A driver-only program (e2e_fork_during_load opens libcuda itself) has no runtime to bind.
                if "[libcudart.so.13]" in needed:
                    self.assertIn(f"libcudart.so.13 => {os.path.join(cudart, 'libcudart.so.13')}", out)
                self.assertNotRegex(out, r"undefined symbol|not found")


class TestKernels(unittest.TestCase):
    def test_delayed_fill_library_has_the_contract_of_the_simulated_one(self):
        lib = os.path.join(BUILD, "gpu", "libgpushim_testkernels.so")
        if not os.path.exists(lib):
            self.skipTest("nvcc was not found at configure time, so the kernel library was not built")
        syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
        self.assertRegex(syms, r"\bT fakecudaLaunchDelayedFill\b")
        dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
        # It must share the program's libcudart (streams are the program's), not carry its own.
        self.assertIn("[libcudart.so.13]", dyn)


if __name__ == "__main__":
    unittest.main()
