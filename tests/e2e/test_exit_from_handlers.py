"""exit() from a program's signal handler (not async-signal-safe, and done all the same): the process
ends, with the report or one line saying why there is none, whatever the handler interrupted: a
CUDA call holding a pool's lock, CUDA waiting for the device, or the shim writing its report.

Not under ASan (tests/e2e/CMakeLists.txt): ASan's allocator cannot be entered again from a signal
handler that interrupted it, so exit() there hangs in the first malloc or free of the exit path,
the program's own or a library's, with or without the shim. Stacks of such hangs (CI, and 4 runs in
120 here): the report's realloc, or a TLS destructor's free, waiting in ASan's allocator while the
interrupted frame sat in ASan's operator new (the simulated device's bookkeeping) or operator
delete; a plain program that mallocs in a loop and exits from SIGALRM hangs 40 runs in 40 (in
LeakSanitizer's exit check). TSan delivers a signal only once the thread is out of its runtime, and
glibc's malloc serves most calls from its per-thread cache without a lock: the normal and TSan
stages make these checks."""
import json
import os
import subprocess
import unittest

from shimtest import POLICIES, ShimTestCase, program, run, scaled


def valid_report(path):
    with open(path) as f:
        return json.load(f)


def exit_from_handler_env(policy):
    """For programs whose signal handler calls exit(), which is not async-signal-safe: the user's
    program modelled here, not a defect of ours for TSan to report."""
    return {"GPUSHIM_POLICY": policy, "GPUSHIM_SUMMARY": "0",
            "TSAN_OPTIONS": os.environ.get("TSAN_OPTIONS", "") + ":report_signal_unsafe=0"}


class ExitFromASignalHandler(ShimTestCase):
    def test_exit_from_a_signal_handler_that_interrupted_a_cuda_call(self):
        # A SIGALRM handler calls exit(0) while main allocates and frees without pause, so it
        # usually interrupts cudaMalloc or cudaFree. The report at exit then waited for the pool's
        # lock, which the interrupted call held on the same thread: the process hung for good
        # (caching, vmm: most runs), where without the shim it ends at once. Now it ends: with the
        # report when the signal came outside the shim's bookkeeping (inside CUDA's own call, as
        # under passthrough), else with one line saying why there is none.
        for policy in POLICIES:
            for attempt in range(scaled(8, 3)):
                with self.subTest(policy=policy, attempt=attempt):
                    try:
                        env = exit_from_handler_env(policy)
                        r = run([program("e2e_exit_paths"), "signal-exit"], env=env, expect_report=False, timeout=30)
                    except subprocess.TimeoutExpired:
                        self.fail("the process hung at exit")
                    self.assertRanOK(r)
                    lines = r.shim_lines()
                    if os.path.exists(r.report_path):
                        self.assertEqual(lines, [], r.stderr)
                        rep = valid_report(r.report_path)
                        self.assertEqual(rep["reason"], "exit")
                        self.assertGreaterEqual(rep["devices"][0]["live_count"], 1)
                    else:
                        self.assertEqual(len(lines), 1, r.stderr)
                        self.assertTrue(lines[0].startswith("gpushim: exit() was called inside a CUDA call"), lines)
                        self.assertEqual(os.listdir(r.workdir), [])

    def test_exit_from_a_signal_handler_while_cuda_waits_or_the_report_is_written(self):
        # The same handler, 50 ms after main entered cudaFree, which synchronizes the device while a
        # 2 s kernel still runs. Under passthrough the thread is then inside CUDA's own function,
        # holding no lock of ours: the report is written. The pools answer the free at once, main
        # returns, and the timer fires while the shim writes the report at exit (a report takes
        # longer than 50 ms to symbolize): exit() again, on the thread that holds the report's lock,
        # which hung for good until 2026-11-28. Now it ends, with one line saying why there is no
        # report (or, on a machine fast enough, with the report and main's status 1).
        for policy in POLICIES:
            with self.subTest(policy=policy):
                try:
                    r = run([program("e2e_exit_paths"), "signal-exit-in-free"], env=exit_from_handler_env(policy),
                            expect_report=False, timeout=60)
                except subprocess.TimeoutExpired:
                    self.fail("the process hung at exit")
                lines = r.shim_lines()
                if policy != "passthrough" and os.path.exists(r.report_path) and r.returncode == 0:
                    # The timer came after the report's file was whole (during the summary): the
                    # report stands, and the line says so.
                    self.assertEqual(lines, ["gpushim: exit() was called again while this thread ended the shim's run "
                                             f"(from a signal handler): the report is written to {r.report_path}; no "
                                             "end of the trace"], r.stderr)
                    rep = valid_report(r.report_path)
                    self.assertEqual(rep["reason"], "exit")
                    self.assertGreaterEqual(rep["devices"][0]["live_count"], 1)
                elif policy == "passthrough" or os.path.exists(r.report_path):
                    self.assertEqual(r.returncode, 0 if policy == "passthrough" else 1, r.stderr)
                    self.assertEqual(lines, [], r.stderr)
                    rep = valid_report(r.report_path)
                    self.assertEqual(rep["reason"], "exit")
                    self.assertGreaterEqual(rep["devices"][0]["live_count"], 1)
                else:
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(lines, ["gpushim: exit() was called again while this thread wrote the shim's "
                                             "report (from a signal handler): no report and no end of the trace"],
                                     r.stderr)
                    self.assertEqual(os.listdir(r.workdir), [])


if __name__ == "__main__":
    unittest.main()
