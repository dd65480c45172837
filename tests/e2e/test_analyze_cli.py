"""gpushim-analyze's command line as a user meets it: a mistake costs one line on stderr, starting
`gpushim-analyze <cmd>: `, and exit status 2, before any input is read; the line says what would
have been right (the nearest option name, the accepted values)."""
import json
import os
import subprocess
import unittest

from shimtest import BIN, check_sanitizer_clean

ANALYZE = os.path.join(BIN, "gpushim-analyze")


def refused(*args):
    """The one line gpushim-analyze prints for a command line it refuses (exit status 2)."""
    proc = subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=60)
    check_sanitizer_clean(proc.stderr, "gpushim-analyze")
    assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
    assert proc.stdout == "", proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


class AnalyzeCommandLine(unittest.TestCase):
    # No input exists: each line must be refused for its options, before a file is opened.
    MISSING = "/nonexistent/run.json"

    def test_misspelt_option_suggests_the_nearest_name(self):
        for cmd, typo, guess in (("replay", "--polcy", "--policy"), ("summary", "--temporary-sm", "--temporary-ms"),
                                 ("export", "--max-point", "--max-points"), ("diff", "-top", "--top"),
                                 ("merge", "--treshold", "--threshold")):
            with self.subTest(cmd=cmd, typo=typo):
                self.assertEqual(refused(cmd, typo, "1", self.MISSING),
                                 f"gpushim-analyze {cmd}: unknown option {typo}: did you mean {guess}? "
                                 f"(gpushim-analyze {cmd} --help)")
        self.assertEqual(refused("sumary", self.MISSING),
                         "gpushim-analyze: unknown command 'sumary': did you mean summary? (gpushim-analyze --help)")

    def test_invalid_choice_names_the_accepted_ones(self):
        self.assertEqual(refused("summary", "--format=jsn", self.MISSING),
                         "gpushim-analyze summary: --format takes text, json or torch, not 'jsn' "
                         "(gpushim-analyze summary --help)")
        self.assertEqual(refused("export", "--format", "flamegraph", "-o", "-", self.MISSING),
                         "gpushim-analyze export: --format takes memory-viz, folded, speedscope, perfetto, "
                         "perfetto-json or timeline, not 'flamegraph' (gpushim-analyze export --help)")
        self.assertIn("--policy takes passthrough, caching, vmm, pytorch or pytorch-expandable, not 'cachng'",
                      refused("replay", "--policy", "cachng", self.MISSING))

    def test_single_value_option_given_twice_is_refused(self):
        # As the launcher does: which of two values was meant is the user's to say.
        self.assertEqual(refused("summary", "--top", "3", "--top=4", self.MISSING),
                         "gpushim-analyze summary: --top is given twice (each option may be given once) "
                         "(gpushim-analyze summary --help)")
        self.assertIn("--output is given twice", refused("export", "--format", "folded", "-o", "a", "--output=b",
                                                          self.MISSING))
        # --policy and --set are lists: repeating them is how to give several.
        self.assertIn("cannot open", subprocess.run([ANALYZE, "replay", "--policy", "caching", "--policy=pytorch",
                                                     self.MISSING], capture_output=True, text=True).stderr)

    def test_options_asking_for_two_outputs_are_refused(self):
        # summary --site printed its text tree whatever --json or --format torch asked for, and
        # --json silently outranked --format torch.
        self.assertEqual(refused("summary", "--site", "1", "--json", self.MISSING),
                         "gpushim-analyze summary: --site prints a text tree: it does not go with --json "
                         "(gpushim-analyze summary --help)")
        self.assertIn("--site prints a text tree: it does not go with --format torch",
                      refused("summary", "--site", "1", "--format", "torch", self.MISSING))
        self.assertIn("--json and --format torch ask for two outputs",
                      refused("summary", "--json", "--format=torch", self.MISSING))
        # What agrees is not refused: the missing input is then what is said.
        for args in (("--json", "--format", "json"), ("--site", "1", "--format", "text")):
            with self.subTest(args=args):
                p = subprocess.run([ANALYZE, "summary", *args, self.MISSING], capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("cannot open", p.stderr)

    def test_an_export_option_of_another_format_is_refused(self):
        # --lines was refused for a format that has no use for it; --metric, --max-events and
        # --max-points were accepted and changed nothing.
        for fmt, opt, value, message in (("perfetto", "--metric", "live", "--metric is for folded and speedscope"),
                                         ("timeline", "--metric", "peak", "--metric is for folded and speedscope"),
                                         ("folded", "--max-events", "5", "--max-events is for memory-viz"),
                                         ("memory-viz", "--max-points", "5",
                                          "--max-points is for perfetto, perfetto-json and timeline"),
                                         ("memory-viz", "--lines", None, "--lines is for folded and speedscope")):
            with self.subTest(format=fmt, option=opt):
                self.assertEqual(refused("export", "--format", fmt, opt, *([value] if value else []), "-o", "-",
                                         self.MISSING),
                                 f"gpushim-analyze export: {message} (gpushim-analyze export --help)")
        for fmt, opt, value in (("speedscope", "--metric", "live"), ("memory-viz", "--max-events", "5"),
                                ("perfetto-json", "--max-points", "5")):
            with self.subTest(format=fmt, option=opt):
                p = subprocess.run([ANALYZE, "export", "--format", fmt, opt, value, "-o", "-", self.MISSING],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("cannot open", p.stderr)

    def test_values_and_operands_are_checked_before_reading(self):
        for args, message in ((("summary", "--top", "0"), "--top takes a whole number from 1 to 1000000000, not '0'"),
                              (("summary", "--temporary-ms", "x"), "--temporary-ms takes a number from 0 to 1000000000"),
                              (("replay", "--capacity", "8Q"), "--capacity takes bytes above 0 with units"),
                              (("replay", "--capacity", "0"), "--capacity takes bytes above 0 with units"),
                              (("diff",), "expects A B (1 input given)"),
                              (("summary", "--json=yes"), "--json takes no value")):
            with self.subTest(args=args):
                self.assertIn(f"gpushim-analyze {args[0]}: {message}", refused(*args, self.MISSING))
        self.assertEqual(refused("export", "--format", "folded", self.MISSING),
                         "gpushim-analyze export: -o FILE is required (gpushim-analyze export --help)")

    def test_a_setting_is_a_gpushim_variable_for_replay_as_for_config(self):
        # replay --set ROUND=1MiB (or FOO=1) replayed with the recorded settings and exited 0, where
        # config --check refused the same name: both now take the names from the library's table,
        # and suggest the prefix a user left off.
        trace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "traces",
                             "serving.trace.gz")
        self.assertEqual(refused("replay", "--policy", "caching", "--set", "ROUND=1MiB", trace),
                         "gpushim-analyze replay: --set ROUND=1MiB: 'ROUND' is not a GPUSHIM_* variable (did you mean "
                         "GPUSHIM_ROUND?) (gpushim-analyze replay --help)")
        self.assertEqual(refused("replay", "--set", "FOO=1", trace),
                         "gpushim-analyze replay: --set FOO=1: 'FOO' is not a GPUSHIM_* variable "
                         "(gpushim-analyze replay --help)")
        self.assertIn("--set GPUSHIM_ROUNDING=1MiB: GPUSHIM_ROUNDING is not a gpushim variable (known: ",
                      refused("replay", "--set", "GPUSHIM_ROUNDING=1MiB", trace))
        self.assertEqual(refused("config", "--check", "ROUND=1MiB"),
                         "gpushim-analyze config: 'ROUND' is not a GPUSHIM_* variable (did you mean GPUSHIM_ROUND?) "
                         "(gpushim-analyze config --help)")
        p = subprocess.run([ANALYZE, "replay", "--json", "--policy", "caching", "--set", "GPUSHIM_ROUND=1MiB", trace],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)



class StandardInput(unittest.TestCase):
    def test_a_dash_reads_the_input_from_standard_input(self):
        # As other tools do: `zcat run.trace.gz | gpushim-analyze summary -`; `-` was "cannot open -".
        trace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "traces",
                             "serving.trace.gz")
        for cmd in (["summary", "--json"], ["replay", "--json", "--policy", "caching"]):
            with self.subTest(cmd=cmd[0]):
                from_file = subprocess.run([ANALYZE, *cmd, trace], capture_output=True, text=True, timeout=120)
                with open(trace, "rb") as f:
                    from_stdin = subprocess.run([ANALYZE, *cmd, "-"], stdin=f, capture_output=True, timeout=120)
                check_sanitizer_clean(from_stdin.stderr.decode(), "gpushim-analyze")
                self.assertEqual(from_stdin.returncode, 0, from_stdin.stderr)
                a, b = json.loads(from_stdin.stdout), json.loads(from_file.stdout)
                if cmd[0] == "replay":  # its timings differ from run to run
                    a, b = a["policies"][0]["devices"], b["policies"][0]["devices"]
                    for d in a + b:
                        d.pop("seconds", None)
                else:
                    self.assertEqual(a.pop("path"), "-")
                    b.pop("path")
                self.assertEqual(a, b)

    def test_standard_input_given_twice_is_refused(self):
        # It gives its bytes once: the second `-` was read as "- is empty: no report or trace".
        for cmd in (["diff", "-", "-"], ["merge", "-", "x.json", "-"]):
            with self.subTest(cmd=cmd[0]):
                self.assertEqual(refused(*cmd), f"gpushim-analyze {cmd[0]}: '-' (standard input) is given more than "
                                                f"once: it can be read only once (gpushim-analyze {cmd[0]} --help)")

    def test_a_short_text_is_neither_a_report_nor_a_trace(self):
        # Shorter than the first block's check: "training log" was "invalid JSON ... invalid literal".
        for text in ("training log\n", "nothing\n", "false", "42"):
            with self.subTest(text=text):
                proc = subprocess.run([ANALYZE, "summary", "-"], input=text, capture_output=True, text=True, timeout=60)
                self.assertEqual(proc.returncode, 1, proc.stderr)
                self.assertEqual(proc.stderr, "gpushim-analyze summary: - is neither a gpushim report (JSON) nor a "
                                              "gpushim trace\n")


if __name__ == "__main__":
    unittest.main()
