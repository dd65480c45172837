"""Iterations and logical time: GPUSHIM_ITERATION_SITE counts every call of the named function exactly
once, and growth is judged on allocation and iteration checkpoints, whatever the pace."""
import json
import os
import subprocess

from pythons import interpreter_cases, interpreters
from shimtest import BIN, ShimTestCase, program, run

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "iteration_calls.py")
TEMPORARIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "iteration_temporaries.py")
HELPERS = os.path.join(BIN, "libe2e_native_helpers.so")


def python_frames(site):
    return [(f["function"], f["file"], f["line"]) for f in site["frames"] if f["kind"] == "python"]


class IterationSite(ShimTestCase):
    def test_every_call_counts_once_whatever_addresses_are_reused(self):
        # train_step(1000 + j): the frame and the temporary int of one call are freed when it
        # returns, and the next call usually gets both addresses back (600 calls were counted as 344).
        for python, version, kind in interpreter_cases(("int", "float", "loop")):
            with self.subTest(python=python, kind=kind):
                r = run([python, CALLS, "600", kind], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                self.assertEqual(r.report["growth"]["iterations"], 600)
                self.assertEqual(r.report["growth"]["iteration_source"], "site")

    def test_temporaries_reallocated_at_the_same_address(self):
        # Arguments that are not numbers were compared by address only: a temporary str, tuple or
        # object freed when the call returns and rebuilt at the same address, or the very same
        # objects on every call, merged calls into one (600 calls were counted as 1).
        for python, version, kind in interpreter_cases(("str", "tuple", "object", "int", "same", "indirect", "tail",
                                                        "thread", "recursive")):
            with self.subTest(python=python, kind=kind):
                r = run([python, TEMPORARIES, "600", kind, HELPERS], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                g = r.report["growth"]
                self.assertEqual((g["iterations"], g["iteration_source"]), (600, "site"), r.stderr)
                self.assertEqual(g["verdict"], "suspects", r.stderr)
                # "recursive" has a second leak site, the inner call's: the outer call's is
                # checked, whose allocation comes first in each iteration.
                top = next(s for s in g["suspects"] if [f["function"] for f in s["frames"]].count("train_step") == 1)
                self.assertAlmostEqual(top["bytes_per_iteration"], 65536, delta=0.01)
                # The sites section merges stacks that show the same frames (3.11's specializing
                # interpreter changes the native frames under the first calls), growth does not.
                site = next(s for s in r.report["sites"] if python_frames(s) == python_frames(top))
                self.assertEqual((site["live_bytes"], site["live_count"]), (600 * 65536, 600))
                self.assertIn("train_step", [f["function"] for f in top["frames"]])

    def test_the_programs_own_profiler_still_sees_every_call(self):
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, TEMPORARIES, "600", "profiled", HELPERS], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                self.assertEqual(r.stdout.strip(), "profiler saw 600 calls")
                self.assertEqual(r.report["growth"]["iterations"], 600)

    def test_frame_evaluator_replaced_by_another_pep523_user(self):
        # 3.9-3.11: when gpushim's evaluator is replaced, it says so and allocation stacks count
        # again (exactly here, the arguments being ints of other values).
        for python, version in interpreters():
            if version >= (3, 12):
                continue
            with self.subTest(python=python):
                r = run([python, TEMPORARIES, "600", "replaced", HELPERS], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                self.assertIn("gpushim: GPUSHIM_ITERATION_SITE: another frame evaluator (PEP 523) replaced gpushim's",
                              r.stderr)
                self.assertEqual(r.report["growth"]["iterations"], 600)

    def test_monitoring_tool_ids_taken_by_the_program(self):
        # 3.12+: gpushim takes a sys.monitoring tool id that no tool is assigned; when the program
        # took both, it says so and recognises calls in allocation stacks, leaving the program's
        # tools alone.
        for python, version in interpreters():
            if version < (3, 12):
                continue
            with self.subTest(python=python):
                r = run([python, TEMPORARIES, "600", "tools_taken", HELPERS], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                self.assertEqual(r.stdout.strip(), "tools [\"the program's own\", \"the program's own\"]")
                self.assertIn("gpushim: GPUSHIM_ITERATION_SITE: sys.monitoring has no free tool id", r.stderr)
                self.assertEqual(r.report["growth"]["iteration_source"], "site")


    def test_the_programs_tool_takes_the_id_gpushim_holds(self):
        # 3.12+: the program asked for the tool id gpushim held and got "tool 4 is already in use"
        # (docs/python.md: the program's own sys.monitoring tools work as before). gpushim moves to
        # another free id, and every call still counts once; with none left it says so and counts
        # calls from allocation stacks (which cannot tell apart calls with the very same arguments).
        for python, version in interpreters():
            if version < (3, 12):
                continue
            with self.subTest(python=python, took="4"):
                r = run([python, TEMPORARIES, "600", "tools_later", HELPERS], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                self.assertEqual(r.stdout.splitlines(), ["refused: tool name must be a str",
                                                         "sys.monitoring use_tool_id None",
                                                         "tools ['gpushim', \"the program's own\"]"])
                g = r.report["growth"]
                self.assertEqual((g["iterations"], g["iteration_source"]), (600, "site"), r.stderr)
            with self.subTest(python=python, took="4 and 3"):
                r = run([python, TEMPORARIES, "600", "tools_later_both", HELPERS],
                        env={"GPUSHIM_ITERATION_SITE": "train_step"})
                self.assertRanOK(r)
                self.assertEqual(r.stdout.strip(), "tools [\"the program's own\", \"the program's own\"]")
                self.assertIn("gpushim: GPUSHIM_ITERATION_SITE: the program took sys.monitoring tool id 3, and no other "
                              "was free; calls are recognised in allocation stacks from now on", r.stderr)
                self.assertGreaterEqual(r.report["growth"]["iterations"], 400)  # every call until then


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
            # Exact: from the checkpoints the marks themselves triggered (a new user measured
            # 987.6 KiB for such a loop, the slope over points before and after the leaking call).
            self.assertAlmostEqual(top["bytes_per_iteration"], MiB, delta=0.001)
            verdicts.append((len(g["suspects"]), top_suspect_line(r.report), top["live_count"]))
        self.assertEqual(verdicts[0], verdicts[1])

    def test_marks_and_an_iteration_site_together_give_the_exact_rate(self):
        # The site counts an iteration at leaky_step's leak and the mark another at the step's end:
        # 60 iterations for 30 MiB. The checkpoints each triggered are at two places of a step;
        # taken together they gave 530,773 bytes per iteration (a review helper's find), the
        # marks' alone give exactly half a MiB, in the report and from the trace.
        from test_traces import analyze_json, traced
        r, trace = traced([program("e2e_planted_leak"), "30", "marks"], env={"GPUSHIM_ITERATION_SITE": "leaky_step"})
        self.assertRanOK(r)
        g = r.report["growth"]
        self.assertEqual((g["iterations"], g["iteration_source"]), (60, "marks+site"))
        self.assertAlmostEqual(g["suspects"][0]["bytes_per_iteration"], MiB / 2, delta=0.001)
        self.assertAlmostEqual(analyze_json("summary", trace)["growth"][0]["bytes_per_iteration"], MiB / 2, delta=0.001)

    def test_too_few_iterations_are_not_judged(self):
        r = run([interpreters()[0][0], PACED, "3", "0"])
        self.assertRanOK(r)
        g = r.report["growth"]
        self.assertEqual((g["verdict"], g["evidence"], g["suspects"]), ("not judged", "3 iterations seen, 8 needed: 5 more iterations", []))
        self.assertIn("gpushim: growth: not judged, 3 iterations seen, 8 needed: 5 more iterations", r.stderr)
        out = subprocess.run([os.path.join(BIN, "gpushim-analyze"), "summary", r.report_path], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("not judged: 3 iterations seen, 8 needed: 5 more iterations", out.stdout)
        self.assertNotIn("none:", out.stdout)

    def test_a_site_that_counts_no_call_says_so(self):
        # A misspelt name, or a native function that is not an exported symbol (main of an
        # executable), counted nothing: one line says so rather than leaving growth on detected
        # iterations without a word. A site that counts says nothing.
        for name in ("no_such_step", "main"):
            with self.subTest(site=name):
                r = run([program("e2e_demo_training_loop")], env={"GPUSHIM_ITERATION_SITE": name})
                self.assertRanOK(r)
                self.assertEqual(r.report["growth"]["iteration_source"], "detected")
                lines = [l for l in r.shim_lines() if "counted no call" in l]
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertTrue(lines[0].startswith(f"gpushim: GPUSHIM_ITERATION_SITE={name} counted no call:"), lines)
                self.assertIn("growth.iteration_source is detected", lines[0])
        r = run([program("e2e_planted_leak"), "30"], env={"GPUSHIM_ITERATION_SITE": "leaky_step"})
        self.assertRanOK(r)
        self.assertEqual(r.report["growth"]["iteration_source"], "site")
        self.assertNotIn("counted no call", r.stderr)

    def test_demo_finds_its_leak_with_default_settings(self):
        r = run([program("e2e_demo_training_loop")])
        self.assertRanOK(r)
        suspects = r.report["growth"]["suspects"]
        self.assertTrue(suspects, r.stderr)
        self.assertIn("forward_backward", suspects[0]["frames"][0]["function"] + "".join(
            f["function"] for f in suspects[0]["frames"]))
        self.assertFalse(any("load_model" in f["function"] for s in suspects for f in s["frames"]))


def summary(path):
    """gpushim-analyze summary --json of a report or a trace, with every suspect and frame."""
    out = subprocess.run([os.path.join(BIN, "gpushim-analyze"), "summary", path, "--json", "--top", "1000", "--frames",
                          "1000"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(out.stderr)
    return json.loads(out.stdout)


def growth_of(view):
    # Suspects by symbolized site (every frame, Python ones included), as a set: what the user
    # is told leaks, whatever order ties come in.
    return (view["growth_verdict"], view["growth_evidence"],
            sorted((tuple(g["frames"]), g["live_bytes"], g["live_count"]) for g in view["growth"]))


class ReportAndTraceAgree(ShimTestCase):
    """One growth definition and one site identity (report/growth_verdict.h, stacks/site_identity.h):
    the exit report, and gpushim-analyze over the trace of the same run, give the same verdict, the
    same evidence and the same suspects, for each kind of verdict and program."""

    def test_same_verdict_evidence_and_suspects(self):
        python = interpreters()[0][0]
        cases = [
            ("native planted leak, marks", [program("e2e_planted_leak"), "30", "marks"], {}, "suspects"),
            ("native planted leak, iteration site", [program("e2e_planted_leak"), "30"],
             {"GPUSHIM_ITERATION_SITE": "leaky_step"}, "suspects"),
            ("demo, default settings", [program("e2e_demo_training_loop")], {}, "suspects"),
            ("steps inside an eight-step pattern", [program("e2e_cycling_shapes"), "40"], {}, "suspects"),
            ("python frames", [python, PACED, "20", "0.01"], {}, "suspects"),
            ("no leak, large flat sites", [program("e2e_train_loop"), "30", "--leak-mib", "0"], {}, "none"),
            ("too short to judge", [python, PACED, "3", "0"], {}, "not judged"),
        ]
        for name, args, env, verdict in cases:
            with self.subTest(program=name):
                r = run(args, env=dict(env, GPUSHIM_TRACE="run.trace"))
                self.assertRanOK(r)
                g = r.report["growth"]
                self.assertEqual(g["verdict"], verdict, r.stderr)
                from_report = growth_of(summary(r.report_path))
                from_trace = growth_of(summary(os.path.join(r.workdir, "run.trace")))
                # The summary of the report says what the report says...
                self.assertEqual(from_report[:2], (g["verdict"], g["evidence"]))
                self.assertEqual(len(from_report[2]), len(g["suspects"]))
                # ...and the trace of the same run says the same.
                self.assertEqual(from_trace, from_report)
                if verdict == "suspects":
                    self.assertTrue(from_trace[2])
                if name == "python frames":
                    self.assertTrue(any(f"paced_leak.py:{leak_line()}" in f for f in from_trace[2][0][0]), from_trace)
