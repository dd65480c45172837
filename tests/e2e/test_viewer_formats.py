"""The exports opened by the viewers people use: speedscope (its own importer, from its npm package,
through scripts/check-speedscope.mjs; scripts/setup installs it) and the format-level checks that
hold whichever consumer reads the file. One traced run of e2e_train_loop feeds them all."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from shimtest import ShimTestCase, program
from test_traces import analyze, analyze_json, traced

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_SPEEDSCOPE = os.path.join(HERE, "..", "..", "scripts", "check-speedscope.mjs")
SPEEDSCOPE = os.environ.get("GPUSHIM_SPEEDSCOPE", "/usr/local/lib/gpushim-node/node_modules/speedscope")
UNITS = {"bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"}


def speedscope_available():
    return shutil.which("node") is not None and os.path.isdir(os.path.join(SPEEDSCOPE, "dist", "release"))


def read_speedscope(testcase, doc):
    """A reader written from speedscope's published schema (file-format-schema.json): the fields it
    requires, the unit enum, and samples that index the shared frames. Returns, per profile,
    {frame index path (outermost first): weight}."""
    testcase.assertEqual(doc["$schema"], "https://www.speedscope.app/file-format-schema.json")
    frames = doc["shared"]["frames"]
    for f in frames:
        testcase.assertIsInstance(f["name"], str)
        if "line" in f:
            testcase.assertIsInstance(f["line"], int)
            testcase.assertIn("file", f)
    out = []
    for p in doc["profiles"]:
        testcase.assertEqual(p["type"], "sampled")
        testcase.assertIn(p["unit"], UNITS)
        for k in ("name", "startValue", "endValue", "samples", "weights"):
            testcase.assertIn(k, p)
        testcase.assertEqual(len(p["samples"]), len(p["weights"]))
        for s in p["samples"]:
            testcase.assertTrue(s)
            testcase.assertTrue(all(0 <= i < len(frames) for i in s))
        testcase.assertEqual(p["endValue"] - p["startValue"], sum(p["weights"]))
        out.append(p)
    return out


class ViewerFormats(ShimTestCase):
    @classmethod
    def setUpClass(cls):
        cls.recorded, cls.trace = traced([program("e2e_train_loop"), "8"], env={"GPUSHIM_POLICY": "caching"})
        cls.summary = analyze_json("summary", cls.trace)
        cls.out = tempfile.mkdtemp(prefix="gpushim-viewers-")

    def export(self, fmt, source, name, *extra):
        path = os.path.join(self.out, name)
        analyze("export", "--format", fmt, source, "-o", path, *extra)
        return path

    def test_speedscope_json_has_byte_units_and_file_and_line(self):
        path = self.export("speedscope", self.trace, "mem.speedscope.json")
        with open(path) as f:
            doc = json.load(f)
        [profile] = read_speedscope(self, doc)
        self.assertEqual(profile["unit"], "bytes")
        self.assertEqual(profile["endValue"], self.summary["devices"][0]["peak_allocated"])
        lines = {f["line"] for f in doc["shared"]["frames"] if f.get("file", "").endswith("train_loop.cpp")}
        self.assertLessEqual({25, 37, 44, 75, 79}, lines)  # two lines of forward_backward stay two frames
        # From a report: what is live.
        report = self.export("speedscope", self.recorded.report_path, "report.speedscope.json")
        with open(report) as f:
            [live] = read_speedscope(self, json.load(f))
        self.assertEqual(live["endValue"], self.recorded.device(0)["live_bytes"])

    def test_folded_frames_name_file_and_line(self):
        path = self.export("folded", self.trace, "mem.folded")
        with open(path) as f:
            lines = f.read().splitlines()
        leaves = {l.rsplit(" ", 1)[0].split(";")[-1] for l in lines}
        self.assertTrue(any(re.fullmatch(r".*forward_backward.* \(train_loop\.cpp:37\)", l) for l in leaves), leaves)
        self.assertTrue(any(re.fullmatch(r".*forward_backward.* \(train_loop\.cpp:44\)", l) for l in leaves), leaves)
        self.assertEqual(sum(int(l.rsplit(" ", 1)[1]) for l in lines), self.summary["devices"][0]["peak_allocated"])
        self.assertIn("--countname bytes", analyze("export", "--help").stdout)

    @unittest.skipUnless(speedscope_available(), "speedscope's npm package is not installed (scripts/setup)")
    def test_speedscope_opens_both_exports_with_its_own_importer(self):
        js = self.export("speedscope", self.trace, "mem.speedscope.json")
        folded = self.export("folded", self.trace, "mem.folded")
        proc = subprocess.run(["node", CHECK_SPEEDSCOPE, "--speedscope", SPEEDSCOPE, js, folded], capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        js_view, folded_view = (json.loads(l) for l in proc.stdout.splitlines())
        peak = self.summary["devices"][0]["peak_allocated"]
        self.assertEqual(js_view["imported_as"], "Importing as speedscope json file")
        [p] = js_view["profiles"]
        self.assertEqual((p["unit"], p["total"]), ("bytes", peak))
        self.assertRegex(p["formatted"], r"^\d+\.\d\d MB$")  # sizes, not "197,132,288"
        # speedscope keeps each line its own frame, weighed by what was allocated there.
        fb = {f["line"]: f["total"] for f in p["frames"] if "forward_backward" in f["name"]}
        at_peak = {s["frames"][0]: s["at_peak_bytes"] for s in self.summary["at_peak_sites"]}
        self.assertEqual(set(fb), {37, 44})
        for line, weight in fb.items():
            self.assertEqual(weight, sum(b for fr, b in at_peak.items() if f"train_loop.cpp:{line}" in fr))
        # The folded file: the same total; unitless by nature of the format (hence --countname).
        self.assertEqual(folded_view["imported_as"], "Importing as collapsed stack format")
        self.assertEqual(folded_view["profiles"][0]["total"], peak)


if __name__ == "__main__":
    unittest.main()
