"""End-to-end tests of leak detection by growth: a Python script and a C++ program of the same
shape (a flat model load, then a step that leaks one MiB per call) must both get the leaking
step as the top growth suspect and the model load as no suspect, with bytes per iteration when
iterations are marked or counted by GPUSHIM_ITERATION_SITE."""
import json
import math
import os
import unittest

from pythons import interpreters
from shimtest import ShimTestCase, program, run
from test_traces import analyze, traced

MiB = 1 << 20
LEAK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "planted_leak.py")
ITERATIONS = 60
# Sampling every 5 ms over a ~0.3 s loop gives the detector its many samples quickly.
FAST = {"GPUSHIM_SAMPLE_MS": "5"}


def names(frames):
    return [f["function"] for f in frames]


class PlantedLeak(ShimTestCase):
    def check_verdict(self, r, per_iteration):
        self.assertRanOK(r)
        growth = r.report["growth"]
        suspects = growth["suspects"]
        self.assertGreaterEqual(len(suspects), 1, growth)
        top = suspects[0]
        self.assertIn("leaky_step", names(top["frames"]), top)
        self.assertEqual(top["live_count"], ITERATIONS)
        self.assertEqual(top["live_bytes"], ITERATIONS * MiB)
        self.assertGreaterEqual(top["growth_bytes"], (ITERATIONS // 2) * MiB)
        self.assertGreaterEqual(top["samples"], 8)
        self.assertGreater(top["trend"], 0.5)
        # 1 MiB a step: the rate is the loop's own (the program times it; a GPU's calls are slower
        # than the simulated device's), within what sampling every 5 ms can tell. The rate is a
        # fit over the samples, the loop's time the program's stopwatch: a stall of a busy machine
        # in the loop's last step (after the last leak) or in its middle moves the two apart by
        # up to a fifth of a 0.3 s loop, hence the margin; the per-iteration rate below is exact.
        loop_s = json.loads(r.stdout.splitlines()[-1])["loop_s"]
        self.assertGreater(top["bytes_per_s"], 0.6 * ITERATIONS * MiB / loop_s, loop_s)
        self.assertLess(top["bytes_per_s"], 1.6 * ITERATIONS * MiB / loop_s, loop_s)
        if per_iteration:
            self.assertGreaterEqual(growth["iterations"], ITERATIONS)
            self.assertAlmostEqual(top["bytes_per_iteration"] / MiB, 1.0, delta=0.1)
        else:
            # No marks: the loop is found in the allocation sequence itself (leak, scratch per step).
            self.assertEqual(growth["iteration_source"], "detected")
            self.assertEqual(growth["detected_period"], 2)
            self.assertEqual(growth["iterations"], ITERATIONS)
            self.assertAlmostEqual(top["bytes_per_iteration"] / MiB, 1.0, delta=0.1)
        # The flat model load is the largest live site, and no suspect.
        for s in suspects:
            self.assertNotIn("load_model", names(s["frames"]), s)
        biggest = r.report["sites"][0]
        self.assertIn("load_model", names(biggest["frames"]))
        self.assertEqual(biggest["live_bytes"], 4 * 64 * MiB)
        # The summary ranks the suspect above the live sites.
        summary = "\n".join(r.shim_lines())
        at_growth = summary.index("growth suspects")
        self.assertLess(at_growth, summary.index("top live allocation sites"))
        self.assertIn("leaky_step", summary[at_growth:summary.index("top live allocation sites")])
        return top

    def test_python_marks(self):
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, LEAK, str(ITERATIONS), "marks"], env=FAST)
                top = self.check_verdict(r, per_iteration=True)
                self.assertEqual(r.report["growth"]["iteration_source"], "marks")
                with open(LEAK) as f:
                    leak_line = [n for n, l in enumerate(f, 1) if l.rstrip().endswith("# @leak")][0]
                frame = next(f for f in top["frames"] if f["function"] == "leaky_step")
                self.assertEqual((frame["kind"], frame["file"], frame["line"]), ("python", LEAK, leak_line))
                self.assertIn(f"at leaky_step (planted_leak.py:{leak_line})", r.stderr)

    def test_python_iteration_site(self):
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, LEAK, str(ITERATIONS)], env=dict(FAST, GPUSHIM_ITERATION_SITE="leaky_step"))
                self.check_verdict(r, per_iteration=True)
                self.assertEqual(r.report["growth"]["iteration_source"], "site")
                self.assertEqual(r.report["growth"]["iterations"], ITERATIONS)

    def test_python_time_only(self):
        python = interpreters()[0][0]
        self.check_verdict(run([python, LEAK, str(ITERATIONS)], env=FAST), per_iteration=False)

    def test_native_program_same_verdict(self):
        for policy in ("passthrough", "caching"):
            with self.subTest(policy=policy):
                r = run([program("e2e_planted_leak"), str(ITERATIONS), "marks"], env=dict(FAST, GPUSHIM_POLICY=policy))
                top = self.check_verdict(r, per_iteration=True)
                self.assertTrue(all(f["kind"] == "native" for f in top["frames"]))

    def test_native_iteration_site(self):
        r = run([program("e2e_planted_leak"), str(ITERATIONS)], env=dict(FAST, GPUSHIM_ITERATION_SITE="leaky_step"))
        self.check_verdict(r, per_iteration=True)
        self.assertEqual(r.report["growth"]["iterations"], ITERATIONS)

    def test_without_stacks_growth_is_not_judged_unless_iterations_are_counted(self):
        # GPUSHIM_STACK_DEPTH=0: every allocation is one site, its live figure swings with the
        # step's scratch memory, and no step is found in it. The demo's leak (256 KiB a step beside
        # ~100 MiB of scratch) went unseen and the verdict read "none", as if nothing grew; it is
        # "not judged", saying why, in the report and in its trace alike. Counted iterations judge
        # the one site per iteration (a leak as plain as the planted one is found either way).
        r, trace = traced([program("e2e_demo_training_loop")],
                          env=dict(FAST, GPUSHIM_STACK_DEPTH="0", GPUSHIM_SUMMARY="5"))
        self.assertRanOK(r)
        growth = r.report["growth"]
        self.assertEqual((growth["verdict"], growth["suspects"]), ("not judged", []), growth)
        self.assertIn("GPUSHIM_STACK_DEPTH=0", growth["evidence"])
        self.assertIn("gpushim: growth: not judged, no stack was captured", r.stderr)
        self.assertIn("not judged: " + growth["evidence"], analyze("summary", trace).stdout)
        r = run([program("e2e_planted_leak"), str(ITERATIONS), "marks"], env=dict(FAST, GPUSHIM_STACK_DEPTH="0"))
        self.assertRanOK(r)
        self.assertEqual(r.report["growth"]["verdict"], "suspects", r.report["growth"])

    def test_program_that_frees_everything_has_no_suspects(self):
        r = run([program("e2e_free_everything")], env=FAST)
        self.assertRanOK(r)
        self.assertEqual(r.report["growth"]["suspects"], [])
        self.assertNotIn("growth suspects", r.stderr)


CYCLING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "cycling_shapes.py")
CYCLING_NATIVE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "cycling_shapes.cpp")
SHAPES = (64, 96, 128, 160, 192, 224, 256, 288)
STEPS = 40


def leak_line(path, marker="@leak"):
    with open(path) as f:
        return [n for n, l in enumerate(f, 1) if marker in l][0]


class CyclingShapes(ShimTestCase):
    """A real job's loop: the sequence length cycles through eight values and the number of
    temporaries depends on it, so the allocation pattern repeats every eight steps. The leak (a
    slice of each step's hidden state) is found after 40 steps with default settings, per step."""

    def check(self, r):
        self.assertRanOK(r)
        g = r.report["growth"]
        self.assertEqual(g["verdict"], "suspects", r.stderr)
        self.assertEqual((g["iteration_source"], g["steps_per_pattern"], g["step_function"]),
                         ("detected", 8, "train_step"), g)
        # The loop's steps; the first may be taken for warm-up by the period's start.
        self.assertIn(g["iterations"], (STEPS - 1, STEPS), g)
        self.assertIn("(the allocation pattern repeats every 8 steps)", g["evidence"])
        top = g["suspects"][0]
        self.assertEqual(top["live_count"], STEPS)
        # Every step's slice is live at the end: the leak per step is their mean (as the pool
        # accounts them: at least what was asked for).
        self.assertGreaterEqual(top["live_bytes"], sum(SHAPES[s % 8] * 8 * 1024 for s in range(STEPS)))
        per_step = top["live_bytes"] / STEPS
        self.assertAlmostEqual(top["bytes_per_iteration"] / per_step, 1.0, delta=0.1, msg=top)
        self.assertIn("per step", r.stderr)
        self.assertIn("pattern repeats every 8 steps", r.stderr)
        return top

    def test_python_step_function(self):
        line = leak_line(CYCLING)
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, CYCLING, str(STEPS)])
                top = self.check(r)
                frame = next(f for f in top["frames"] if f["function"] == "train_step")
                self.assertEqual((frame["file"], frame["line"]), (CYCLING, line))

    def test_analyze_names_the_rate_as_the_shim_does(self):
        # One figure, one word: the shim's summary said "per step" for the detected steps, and
        # gpushim-analyze summary "per iteration" for the same figure, of the report and of the
        # trace. Counted iterations (marks) are "per iteration" on both sides.
        cases = [([program("e2e_cycling_shapes"), str(STEPS)], "step", "iteration"),
                 ([program("e2e_planted_leak"), "40", "marks"], "iteration", "step")]
        for args, unit, other in cases:
            with self.subTest(program=os.path.basename(args[0])):
                r, trace = traced(args, env={"GPUSHIM_SUMMARY": "10"})
                self.assertRanOK(r)
                self.assertIn(" per %s, " % unit, r.stderr)
                for source in (r.report_path, trace):
                    text = analyze("summary", source).stdout
                    block = text[text.index("Growth suspects"):]
                    self.assertIn(" per %s)" % unit, block, source)
                    self.assertNotIn(" per %s" % other, text, source)

    def test_native_program_under_a_static_runtimes_frames(self):
        r = run([program("e2e_cycling_shapes"), str(STEPS)])
        top = self.check(r)
        names = [f["function"] for f in top["frames"]]
        # The JSON keeps every frame: the static-runtime-like one sits above the user's line...
        self.assertTrue(any(n.startswith("libcudart_static_") for n in names), names)
        # ...which every printed stack leads with.
        block = r.stderr[r.stderr.index("growth suspects"):]
        at = [l.split("at ", 1)[1] for l in block.splitlines() if l.startswith("gpushim:       at ")]
        self.assertTrue(at[0].startswith("train_step cycling_shapes.cpp:%d" % leak_line(CYCLING_NATIVE_SOURCE)), at)
        self.assertFalse(any("libcudart_static" in a or a.startswith("cudaMalloc") for a in at), at)


if __name__ == "__main__":
    unittest.main()
