"""Every normal way a job ends writes the report: SIGTERM and SIGINT (how batch systems and people
stop jobs) when the program left them at their default, quick_exit, and a snapshot asked for just
before exit; and GPUSHIM_EXIT_CODE turns the report into a CI verdict."""
import json
import os
import signal
import subprocess
import sys
import tempfile

from pythons import interpreters
from shimtest import BIN, POLICIES, SHIM, ShimTestCase, base_env, check_sanitizer_clean, program, run, scaled

MiB = 1 << 20
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python")


class TerminationSignals(ShimTestCase):
    def stop_busy(self, sig, policy, mode="busy", threads="4"):
        """Runs e2e_exit_paths `mode` (threads allocating and freeing without pause), sends `sig` once
        it is busy; returns (returncode, stderr, workdir)."""
        wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
        env = base_env({"GPUSHIM_REPORT": os.path.join(wd, "report.json"), "GPUSHIM_POLICY": policy,
                        "GPUSHIM_METRICS": os.path.join(wd, "m.prom")})
        proc = subprocess.Popen([program("e2e_exit_paths"), mode, threads], env=env, cwd=wd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:
                if line.strip() == "busy":
                    break
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)  # a deadlock in the report fails here
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        check_sanitizer_clean(stderr)
        return proc.returncode, stderr, wd

    def test_sigterm_and_sigint_write_the_report_then_end_by_the_signal(self):
        # The signal lands while four threads are inside cudaMalloc/cudaFree (the shim's locks, the
        # pool's, malloc's): the report is still written, whole, and the process ends by the signal.
        for sig in (signal.SIGTERM, signal.SIGINT):
            for policy in POLICIES:
                for attempt in range(scaled(2, 1)):
                    with self.subTest(signal=sig.name, policy=policy, attempt=attempt):
                        rc, stderr, wd = self.stop_busy(sig, policy)
                        self.assertEqual(rc, -sig, stderr)
                        with open(os.path.join(wd, "report.json")) as f:
                            report = json.load(f)
                        self.assertEqual(report["reason"], "exit")
                        dev = report["devices"][0]
                        self.assertGreaterEqual(dev["live_count"], 1)
                        self.assertGreater(dev["total_allocs"], 1000)
                        self.assertTrue(any(any("leak_at_exit" in (fr["function"] or "") for fr in s["frames"])
                                            for s in report["sites"]))
                        self.assertIn("gpushim: report for ", stderr)
                        with open(os.path.join(wd, "m.prom")) as f:
                            running = [l for l in f if l.startswith("gpushim_running{")]
                        self.assertEqual([l.split()[-1] for l in running], ["0"])

    def test_a_program_that_handles_sigterm_keeps_its_handler(self):
        rc, stderr, wd = self.stop_busy(signal.SIGTERM, "caching", mode="own-sigterm")
        self.assertEqual(rc, 9, stderr)
        self.assertNotIn("report.json", os.listdir(wd))

    def test_python_program_stopped_with_sigterm(self):
        code = ("import ctypes, sys, time; sys.path.insert(0, %r); from cuda_ctypes import cuda, check; "
                "p = ctypes.c_void_p(); check(cuda.cudaMalloc(ctypes.byref(p), 3 << 20)); print('busy', flush=True); "
                "time.sleep(60)") % HERE
        wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
        proc = subprocess.Popen([interpreters()[0][0], "-c", code], env=base_env({"GPUSHIM_REPORT": "r.json"}), cwd=wd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(proc.stdout.readline().strip(), "busy")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, -signal.SIGTERM, stderr)
        with open(os.path.join(wd, "r.json")) as f:
            self.assertEqual(json.load(f)["devices"][0]["live_bytes"], 3 * MiB)


class PythonEnds(ShimTestCase):
    """Python programs that end without the C library's exit(), where the report is written:
    Ctrl-C (CPython kills itself with SIGINT once finalized, for the exit status 130) and
    multiprocessing workers started by fork or forkserver (os._exit)."""

    def test_ctrl_c_writes_the_report_then_ends_by_sigint(self):
        for py, version in interpreters():
            for how in ("raise KeyboardInterrupt", "os.kill(os.getpid(), signal.SIGINT); time.sleep(60)"):
                with self.subTest(python=version, how=how):
                    code = ("import ctypes, os, signal, sys, time; sys.path.insert(0, %r); "
                            "from cuda_ctypes import cuda, check; p = ctypes.c_void_p(); "
                            "check(cuda.cudaMalloc(ctypes.byref(p), 3 << 20)); %s") % (HERE, how)
                    wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
                    proc = subprocess.run([py, "-c", code], env=base_env({"GPUSHIM_REPORT": "r.json"}), cwd=wd,
                                          capture_output=True, text=True, timeout=120)
                    check_sanitizer_clean(proc.stderr)
                    self.assertEqual(proc.returncode, -signal.SIGINT, proc.stderr)  # as without the shim
                    self.assertIn("KeyboardInterrupt", proc.stderr)
                    with open(os.path.join(wd, "r.json")) as f:
                        self.assertEqual(json.load(f)["devices"][0]["live_bytes"], 3 * MiB)

    def test_every_multiprocessing_worker_writes_its_report(self):
        code = ("import ctypes, multiprocessing as mp, sys; sys.path.insert(0, %r)\n"
                "def work(i):\n"
                "    from cuda_ctypes import cuda, check\n"
                "    p = ctypes.c_void_p(); check(cuda.cudaMalloc(ctypes.byref(p), (i + 1) << 20))\n"
                "if __name__ == '__main__':\n"
                "    ctx = mp.get_context(sys.argv[1])\n"
                "    ps = [ctx.Process(target=work, args=(i,)) for i in range(3)]\n"
                "    [p.start() for p in ps]; [p.join() for p in ps]\n"
                "    print([p.exitcode for p in ps])\n") % HERE
        py = interpreters()[0][0]
        for method in ("fork", "forkserver", "spawn"):
            with self.subTest(start_method=method):
                wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
                with open(os.path.join(wd, "job.py"), "w") as f:
                    f.write(code)
                proc = subprocess.run([py, "job.py", method], env=base_env({"GPUSHIM_REPORT": "r.%p.json"}), cwd=wd,
                                      capture_output=True, text=True, timeout=120)
                check_sanitizer_clean(proc.stderr)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stdout.strip(), "[0, 0, 0]")
                live = []
                for name in os.listdir(wd):
                    if name.startswith("r.") and name.endswith(".json"):
                        with open(os.path.join(wd, name)) as f:
                            live.append(json.load(f)["devices"][0]["live_bytes"])
                # One report per worker (the parent never touched CUDA), each with its own block.
                self.assertEqual(sorted(live), [1 * MiB, 2 * MiB, 3 * MiB], proc.stderr)


    def test_os_exit_reads_as_it_does_without_the_shim(self):
        # The shim's os._exit took no keywords (os._exit(status=3): TypeError, exit 1), did not
        # pickle, had no signature, and, under GPUSHIM_EXIT_CODE, printed "exit status 9" and
        # exited 0 (the status was only replaced on exit(), which os._exit never reaches).
        for py, version in interpreters():
            with self.subTest(python=version):
                code = ("import ctypes, inspect, os, pickle, posix, sys; sys.path.insert(0, %r); "
                        "from cuda_ctypes import cuda, check; p = ctypes.c_void_p(); "
                        "check(cuda.cudaMalloc(ctypes.byref(p), 1 << 20)); "
                        "import time; time.sleep(0.05); "  # the hook is installed at a safe point
                        "print(os._exit is posix._exit, os._exit.__module__, str(inspect.signature(os._exit)), "
                        "pickle.loads(pickle.dumps(os._exit)) is os._exit, 'gpushim' in (os._exit.__doc__ or ''), "
                        "flush=True); "
                        "os._exit(status=int(sys.argv[1]))") % HERE
                # 256 exits 0 too: what the parent sees is the low byte (it was not replaced).
                for status, exit_code, expected in (("3", None, 3), ("0", "9", 9), ("4", "9", 4), ("256", "9", 9)):
                    wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
                    env = {"GPUSHIM_REPORT": "r.json"}
                    if exit_code:
                        env.update({"GPUSHIM_EXIT_CODE": exit_code, "GPUSHIM_EXIT_LEAK_BYTES": "0"})
                    proc = subprocess.run([py, "-c", code, status], env=base_env(env), cwd=wd, capture_output=True,
                                          text=True, timeout=120)
                    check_sanitizer_clean(proc.stderr)
                    self.assertEqual(proc.returncode, expected, proc.stderr)
                    self.assertEqual(proc.stdout, "True posix (status) True True\n", proc.stderr)
                    with open(os.path.join(wd, "r.json")) as f:
                        self.assertEqual(json.load(f)["devices"][0]["live_bytes"], 1 * MiB)


    def test_a_bad_os_exit_the_program_catches_does_not_end_the_run(self):
        # os._exit(None) raises TypeError; a program that catches it goes on. The report was
        # written at the failed call and never again (1 MiB live of 5).
        code = ("import ctypes, os, sys, time; sys.path.insert(0, %r); "
                "from cuda_ctypes import cuda, check; p = ctypes.c_void_p(); "
                "check(cuda.cudaMalloc(ctypes.byref(p), 1 << 20)); time.sleep(0.05)\n"
                "try:\n    os._exit(None)\nexcept TypeError as e:\n    print(type(e).__name__, flush=True)\n"
                "q = ctypes.c_void_p(); check(cuda.cudaMalloc(ctypes.byref(q), 4 << 20))\n") % HERE
        py = interpreters()[0][0]
        wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
        proc = subprocess.run([py, "-c", code], env=base_env({"GPUSHIM_REPORT": "r.json"}), cwd=wd, capture_output=True,
                              text=True, timeout=120)
        check_sanitizer_clean(proc.stderr)
        self.assertEqual((proc.returncode, proc.stdout), (0, "TypeError\n"), proc.stderr)
        with open(os.path.join(wd, "r.json")) as f:
            self.assertEqual(json.load(f)["devices"][0]["live_bytes"], 5 * MiB)


class OtherEnds(ShimTestCase):
    def test_quick_exit_writes_the_report(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_exit_paths"), "quick-exit"], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                self.assertEqual(r.device(0)["live_count"], 1)
                self.assertEqual(len(r.sites_with_function("leak_at_exit")), 1)

    def test_snapshot_asked_just_before_exit_is_written(self):
        for attempt in range(scaled(5, 2)):
            with self.subTest(attempt=attempt):
                r = run([program("e2e_exit_paths"), "snapshot-exit"])
                self.assertRanOK(r)
                with open(os.path.join(r.workdir, "report.snapshot.1.json")) as f:
                    snap = json.load(f)
                self.assertEqual(snap["reason"], "snapshot")
                self.assertEqual(snap["devices"][0]["live_count"], 1)


class ExitCode(ShimTestCase):
    def test_growth_suspects_fail_the_run(self):
        r = run([program("e2e_planted_leak"), "60", "marks"], env={"GPUSHIM_SAMPLE_MS": "5", "GPUSHIM_EXIT_CODE": "3"})
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertTrue(r.report["growth"]["suspects"])
        line = [l for l in r.shim_lines() if "GPUSHIM_EXIT_CODE" in l]
        self.assertEqual(len(line), 1, r.stderr)
        self.assertIn("1 growth suspect", line[0])

    def test_invalid_frees_fail_the_run(self):
        r = run([program("e2e_invalid_frees")], env={"GPUSHIM_EXIT_CODE": "7"})
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertIn("invalid free", "\n".join(l for l in r.shim_lines() if "GPUSHIM_EXIT_CODE" in l))

    def test_leak_threshold(self):
        # e2e_exit_paths return: 2 MiB live at exit, no growth, no invalid free.
        for threshold, expected in (("off", 0), ("4MiB", 0), ("1MiB", 4), ("0", 4)):
            with self.subTest(threshold=threshold):
                r = run([program("e2e_exit_paths"), "return"],
                        env={"GPUSHIM_EXIT_CODE": "4", "GPUSHIM_EXIT_LEAK_BYTES": threshold})
                self.assertEqual(r.returncode, expected, r.stderr)
                lines = [l for l in r.shim_lines() if "GPUSHIM_EXIT_CODE" in l]
                if expected:
                    self.assertIn("2.0 MiB of device memory live at exit", lines[0])
                else:
                    self.assertEqual(lines, [])

    def test_verdict_whatever_the_other_outputs(self):
        # The verdict is its own output: neither GPUSHIM_REPORT=off nor GPUSHIM_SUMMARY=0 (a CI
        # job's quiet setup) may silence it, and it never brings back an output that was turned off.
        # e2e_exit_paths return leaves 2 MiB live at exit.
        for report in ("file", "off"):
            for summary in ("5", "0"):
                for code in ("4", "off"):
                    with self.subTest(report=report, summary=summary, exit_code=code):
                        wd = tempfile.mkdtemp(prefix="gpushim-e2e-")
                        env = {"GPUSHIM_SUMMARY": summary, "GPUSHIM_EXIT_CODE": code, "GPUSHIM_EXIT_LEAK_BYTES": "0"}
                        if report == "off":
                            env["GPUSHIM_REPORT"] = "off"
                        r = run([program("e2e_exit_paths"), "return"], env=env, workdir=wd,
                                expect_report=report == "file")
                        self.assertEqual(r.returncode, 4 if code == "4" else 0, r.stderr)
                        verdict = [l for l in r.shim_lines() if "GPUSHIM_EXIT_CODE" in l and "has no effect" not in l]
                        self.assertEqual(len(verdict), 1 if code == "4" else 0, r.stderr)
                        # Without an exit code the threshold does nothing, and says so.
                        inert = [l for l in r.shim_lines() if l.startswith("gpushim: GPUSHIM_EXIT_LEAK_BYTES=0 has no effect")]
                        self.assertEqual(len(inert), 0 if code == "4" else 1, r.stderr)
                        if verdict:
                            self.assertIn("2.0 MiB of device memory live at exit", verdict[0])
                        self.assertEqual(os.path.exists(os.path.join(wd, "report.json")), report == "file")
                        self.assertEqual("gpushim: report for " in r.stderr, summary != "0", r.stderr)

    def test_off_by_default_and_a_failing_program_keeps_its_status(self):
        r = run([program("e2e_invalid_frees")])
        self.assertEqual(r.returncode, 0, r.stderr)
        code = ("import ctypes, sys; sys.path.insert(0, %r); from cuda_ctypes import cuda, check; "
                "p = ctypes.c_void_p(); check(cuda.cudaMalloc(ctypes.byref(p), 1 << 20)); sys.exit(5)") % HERE
        r = run([interpreters()[0][0], "-c", code], env={"GPUSHIM_EXIT_CODE": "4", "GPUSHIM_EXIT_LEAK_BYTES": "0"})
        self.assertEqual(r.returncode, 5, r.stderr)

    def test_python_leak_freed_at_teardown_still_fails(self):
        r = run([interpreters()[0][0], os.path.join(HERE, "finalizer_leak.py"), "40", "del"],
                env={"GPUSHIM_EXIT_CODE": "6", "GPUSHIM_SAMPLE_MS": "5"})
        self.assertEqual(r.returncode, 6, r.stderr)

    def test_launcher_option(self):
        # The launcher's --error-exitcode N is GPUSHIM_EXIT_CODE=N, in either spelling.
        for args in (["--error-exitcode", "9"], ["--error-exitcode=9"]):
            r = subprocess.run([os.path.join(BIN, "gpushim"), "run", "--lib", SHIM, "--dry-run"] + args + ["--", "true"],
                               capture_output=True, text=True, env=base_env(preload=False))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("GPUSHIM_EXIT_CODE=9", r.stdout.splitlines())


if __name__ == "__main__":
    import unittest
    unittest.main()
