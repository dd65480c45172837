"""Iterations and logical time: GPUSHIM_ITERATION_SITE counts every call of the named function exactly
once, and growth is judged on allocation and iteration checkpoints, whatever the pace."""
import os
import subprocess

from pythons import interpreters
from shimtest import BIN, ShimTestCase, program, run

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "iteration_calls.py")


class IterationSite(ShimTestCase):
    def test_every_call_counts_once_whatever_addresses_are_reused(self):
        # train_step(1000 + j): the frame and the temporary int of one call are freed when it
        # returns, and the next call usually gets both addresses back (600 calls were counted as 344).
        for python, version in interpreters():
            for kind in ("int", "float", "loop"):
                with self.subTest(python=python, kind=kind):
                    r = run([python, CALLS, "600", kind], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                    self.assertRanOK(r)
                    self.assertEqual(r.report["growth"]["iterations"], 600)
                    self.assertEqual(r.report["growth"]["iteration_source"], "site")


PACED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "paced_leak.py")
MiB = 1 << 20


def leak_line():
    with open(PACED) as f:
        return [n for n, l in enumerate(f, 1) if l.rstrip().endswith("# @leak")][0]


def top_suspect_line(report):
    top = report["growth"]["suspects"][0]
    return [(f["file"], f["line"]) for f in top["frames"] if f["kind"] == "python"][0]


class LogicalTime(ShimTestCase):
    """Growth is judged on checkpoints of allocation events and iterations, with the default
    sampling interval: the pace of the program does not change the verdict."""

    def test_short_and_long_runs_get_the_same_suspect(self):
        python = interpreters()[0][0]
        verdicts = []
        for pace in ("0.01", "0.25"):  # 20 steps: about 0.2 s, and about 5 s
            r = run([python, PACED, "20", pace])
            self.assertRanOK(r)
            g = r.report["growth"]
            self.assertEqual(g["verdict"], "suspects", r.stderr)
            self.assertEqual(g["iterations"], 20)
            top = g["suspects"][0]
            self.assertEqual(top_suspect_line(r.report), (PACED, leak_line()))
            self.assertEqual(top["live_bytes"], 20 * MiB)
            self.assertAlmostEqual(top["bytes_per_iteration"] / MiB, 1.0, delta=0.1)
            verdicts.append((len(g["suspects"]), top_suspect_line(r.report), top["live_count"]))
        self.assertEqual(verdicts[0], verdicts[1])

    def test_too_few_iterations_are_not_judged(self):
        r = run([interpreters()[0][0], PACED, "3", "0"])
        self.assertRanOK(r)
        g = r.report["growth"]
        self.assertEqual((g["verdict"], g["evidence"], g["suspects"]), ("not judged", "3 iterations seen, 8 needed", []))
        self.assertIn("gpushim: growth: not judged, 3 iterations seen, 8 needed", r.stderr)
        out = subprocess.run([os.path.join(BIN, "gpushim-analyze"), "summary", r.report_path], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("not judged: 3 iterations seen, 8 needed", out.stdout)
        self.assertNotIn("none:", out.stdout)

    def test_demo_finds_its_leak_with_default_settings(self):
        r = run([program("e2e_demo_training_loop")])
        self.assertRanOK(r)
        suspects = r.report["growth"]["suspects"]
        self.assertTrue(suspects, r.stderr)
        self.assertIn("forward_backward", suspects[0]["frames"][0]["function"] + "".join(
            f["function"] for f in suspects[0]["frames"]))
        self.assertFalse(any("load_model" in f["function"] for s in suspects for f in s["frames"]))


class ReportAndTraceAgree(ShimTestCase):
    def test_same_suspects(self):
        # The report's growth (checkpoints in the shim) and the trace's (gpushim-analyze over every
        # event) name the same sites, at the same user line, with the same live bytes.
        for args in ([interpreters()[0][0], PACED, "20", "0.01"], [program("e2e_demo_training_loop")]):
            with self.subTest(program=args[-1] if len(args) < 3 else args[1]):
                r = run(args, env={"GPUSHIM_TRACE": "run.trace"})
                self.assertRanOK(r)
                out = subprocess.run([os.path.join(BIN, "gpushim-analyze"), "summary",
                                      os.path.join(r.workdir, "run.trace"), "--json"], capture_output=True, text=True,
                                     timeout=120)
                self.assertEqual(out.returncode, 0, out.stderr)
                import json
                from_trace = [(g["frames"][0], g["live_bytes"]) for g in json.loads(out.stdout)["growth"]]
                out = subprocess.run([os.path.join(BIN, "gpushim-analyze"), "summary", r.report_path, "--json"],
                                     capture_output=True, text=True, timeout=120)
                self.assertEqual(out.returncode, 0, out.stderr)
                from_report = [(g["frames"][0], g["live_bytes"]) for g in json.loads(out.stdout)["growth"]]
                self.assertTrue(from_report)
                self.assertEqual(from_report, from_trace)
