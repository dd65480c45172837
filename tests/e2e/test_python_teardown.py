"""The exit report of a Python program describes the program, not its teardown: memory that object
finalizers free while the interpreter shuts down (atexit callbacks, module teardown) still counts
as live and keeps its site a growth suspect (interpose/python/interpreter_shutdown.h)."""
import json
import os
import subprocess
import unittest

from pythons import interpreters
from shimtest import BUILD, FAKECUDA, REAL_GPU, SANITIZER, ShimTestCase, last_json, program, run
from test_traces import analyze

MiB = 1 << 20
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python")
NUMBA_LEAK = os.path.join(HERE, "numba_leak.py")
FINALIZER_LEAK = os.path.join(HERE, "finalizer_leak.py")
POOL_RELEASE = os.path.join(HERE, "pool_release.py")
STEPS = 40
FAST = {"GPUSHIM_SAMPLE_MS": "5"}


def marked_line(path, marker):
    with open(path) as f:
        return [n for n, l in enumerate(f, 1) if l.rstrip().endswith("# " + marker)][0]


def numba_python():
    """An interpreter that imports numba (scripts/setup installs Debian's python3-numba)."""
    candidates = [p for p, _ in interpreters()]
    if SANITIZER != "thread":
        candidates.append("/usr/bin/python3")
    for path in dict.fromkeys(candidates):
        if os.path.exists(path) and subprocess.run([path, "-c", "import numba.cuda"], capture_output=True,
                                                   env=dict(os.environ, **({} if SANITIZER != "thread" else
                                                            __import__("pythons").stand_in_env()))).returncode == 0:
            return path
    if SANITIZER == "thread":
        raise unittest.SkipTest("the TSan stand-in's interpreter has no numba")
    raise AssertionError("no interpreter with numba: run scripts/setup (python3-numba)")


def frame_at(frames, path, line):
    return [f for f in frames if f["kind"] == "python" and f["file"] == path and f["line"] == line]


class Teardown(ShimTestCase):
    def check_held_leak(self, r, path, line, per_step):
        self.assertRanOK(r)
        self.assertTrue(r.report["teardown"]["observed"], r.report["teardown"])
        suspects = r.report["growth"]["suspects"]
        self.assertGreaterEqual(len(suspects), 1, r.stderr)
        top = suspects[0]
        self.assertTrue(frame_at(top["frames"], path, line), top["frames"])
        self.assertEqual(top["live_count"], STEPS)
        self.assertEqual(top["live_bytes"], STEPS * per_step)
        site = [s for s in r.report["sites"] if frame_at(s["frames"], path, line)]
        self.assertEqual(len(site), 1, r.report["sites"])
        self.assertEqual(site[0]["live_bytes"], STEPS * per_step)
        self.assertGreaterEqual(r.report["devices"][0]["live_bytes"], STEPS * per_step)
        # Live by module is of the same moment as the devices' live (the teardown's start).
        device_rows = [m for m in r.report["modules"] if m["kind"] == "device" and m["device"] == 0]
        self.assertEqual(sum(m["live_bytes"] for m in device_rows), r.report["devices"][0]["live_bytes"], device_rows)
        # So is the pool's state: it held what was live, and the rounding waste is that of the live
        # blocks (whole MiB and small arrays here), not live then less requested after the teardown.
        dev = r.report["devices"][0]
        self.assertGreaterEqual(dev["pool"]["reserved_bytes"], dev["live_bytes"], dev["pool"])
        self.assertLessEqual(dev["pool"]["requested_bytes"], dev["live_bytes"], dev["pool"])
        self.assertLess(dev["internal_waste_bytes"], MiB, dev)
        return site[0]

    def test_numba_device_arrays_in_a_global_list(self):
        python = numba_python()
        env = dict(FAST)
        if not REAL_GPU:
            env["NUMBA_CUDA_DRIVER"] = os.path.join(FAKECUDA, "libcuda.so.1")
        r = run([python, NUMBA_LEAK, str(STEPS)], env=env)
        site = self.check_held_leak(r, NUMBA_LEAK, marked_line(NUMBA_LEAK, "@leak"), MiB)
        # numba's finalizers freed the arrays while the interpreter shut down (what hid the leak).
        self.assertGreater(r.report["teardown"]["freed_bytes"], 0)
        self.assertGreater(site["freed_during_shutdown_count"], 0)
        # The weights, allocated once, are live and no suspect.
        weights = marked_line(NUMBA_LEAK, "@weights")
        self.assertFalse(any(frame_at(s["frames"], NUMBA_LEAK, weights) for s in r.report["growth"]["suspects"]))
        self.assertTrue(any(frame_at(s["frames"], NUMBA_LEAK, weights) for s in r.report["sites"]))

    def test_object_held_leak_freed_by_finalizers_at_teardown(self):
        line = marked_line(FINALIZER_LEAK, "@leak")
        for python, version in interpreters():
            for mode in ("del", "finalize"):
                with self.subTest(python=python, mode=mode):
                    r = run([python, FINALIZER_LEAK, str(STEPS), mode], env=FAST)
                    site = self.check_held_leak(r, FINALIZER_LEAK, line, MiB)
                    # Every leaked buffer was freed by its finalizer during teardown, and counted so.
                    self.assertEqual(site["freed_during_shutdown_count"], STEPS)
                    self.assertEqual(site["freed_during_shutdown_bytes"], STEPS * MiB)
                    self.assertEqual(r.report["teardown"]["freed_count"], STEPS)
                    self.assertEqual(r.report["devices"][0]["live_count"], STEPS)
                    self.assertEqual(r.report["devices"][0]["total_frees"], 2 * STEPS)
                    self.assertIn("(40.0 MiB of it freed during interpreter shutdown)", r.stderr)

    def test_summary_says_which_moment_its_live_figures_are_of(self):
        # `gpushim-analyze summary` of such a report said "live at the end 40.0 MiB in 40
        # allocations; 80 allocs, 80 frees": allocs - frees (counted to the end) disagreed with
        # the live count (the teardown's start) on one line, and a snapshot's figures read as the end.
        python, _ = interpreters()[0]
        r = run([python, FINALIZER_LEAK, str(STEPS), "del"], env=FAST)
        self.assertRanOK(r)
        dev = r.report["devices"][0]
        self.assertEqual(dev["total_allocs"] - dev["total_frees"], 0, dev)
        text = analyze("summary", r.report_path).stdout
        self.assertIn(f"live when the teardown began 40.0 MiB in {STEPS} allocations; {dev['total_allocs']} allocs, "
                      f"{dev['total_frees']} frees", text)
        self.assertIn(f"the teardown began at {r.report['teardown']['began_s']:.2f} s and then freed 40.0 MiB in "
                      f"{STEPS} allocations, still counted live above; the frees above include them", text)
        self.assertIn("; when the teardown began reserved ", text)
        # The shim's own summary on stderr says it the same way (it read "live 40.0 MiB in 40
        # allocations, ... 80 allocs, 80 frees", then a note saying "below" for figures above).
        self.assertIn(f"device 0: live when the teardown began 40.0 MiB in {STEPS} allocations,", r.stderr)
        self.assertRegex(r.stderr, rf"teardown began at [0-9.]+ s and then freed 40.0 MiB in {STEPS} allocations "
                                   r"\(object finalizers\), still counted live above and below; the frees above include them")
        self.assertIn("top allocation sites live when the teardown began:", r.stderr)
        self.assertIn("\nTop sites live when the teardown began\n", text)
        self.assertNotIn("at the end", text)
        # The same report as a snapshot: its figures are of that moment, and a snapshot has no teardown.
        snapshot = os.path.join(r.workdir, "report.snapshot.1.json")
        with open(snapshot, "w") as f:
            json.dump(dict(r.report, reason="snapshot"), f)
        text = analyze("summary", snapshot).stdout
        self.assertIn(f"live at the snapshot 40.0 MiB in {STEPS} allocations;", text)
        self.assertIn("; at the snapshot reserved ", text)
        self.assertIn("\nTop sites live at the snapshot\n", text)
        self.assertNotIn("teardown", text)
        self.assertNotIn("at the end", text)

    def test_native_program_has_no_teardown(self):
        r = run([program("e2e_planted_leak"), "20", "marks"])
        self.assertRanOK(r)
        self.assertEqual(r.report["teardown"], {"observed": False, "began_s": 0, "freed_bytes": 0, "freed_count": 0})

    def test_cuda_pools_are_read_again_at_the_teardown(self):
        # The pool still reserved 128 MiB when the shim read it at the free; CUDA gave them back
        # once the stream got there. The teardown's figures, which the report shows, once kept
        # the reading at the free.
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, POOL_RELEASE], env={"GPUSHIM_POLICY": "passthrough", "GPUSHIM_SAMPLE_MS": "60000"})
                self.assertRanOK(r)
                self.assertEqual(last_json(r), {"reserved_live": 128 * MiB, "reserved_end": 0})
                self.assertTrue(r.report["teardown"]["observed"])
                dev = r.report["devices"][0]
                self.assertEqual(dev["pool"]["reserved_bytes"], 0, dev["pool"])
                self.assertEqual(dev["peak_reserved_bytes"], 128 * MiB)


if __name__ == "__main__":
    unittest.main()
