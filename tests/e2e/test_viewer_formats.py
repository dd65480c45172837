"""The exports opened by the viewers people use: speedscope (its own importer, from its npm package,
through scripts/check-speedscope.mjs; scripts/setup installs it), Perfetto (its trace processor
cannot be built or installed here: read by a decoder written from the published .proto files,
google/perfetto protos/perfetto/trace/...), and the format-level checks that hold whichever
consumer reads the file. One traced run of e2e_train_loop feeds them all."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from shimtest import ShimTestCase, program, require_tool
from test_summary_views import L
from test_traces import analyze, analyze_json, traced

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_SPEEDSCOPE = os.path.join(HERE, "..", "..", "scripts", "check-speedscope.mjs")
SPEEDSCOPE = os.environ.get("GPUSHIM_SPEEDSCOPE", "/usr/local/lib/gpushim-node/node_modules/speedscope")
UNITS = {"bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"}


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


def proto_fields(data):
    """Decodes one protobuf message into {field number: [values]}: varints as ints, length-delimited
    fields as bytes (nested messages are decoded by the caller that knows the schema)."""
    out, i = {}, 0

    def varint():
        nonlocal i
        v = shift = 0
        while True:
            b = data[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
        elif wire == 2:
            n = varint()
            value = data[i:i + n]
            i += n
            assert i <= len(data), "length past the end of the message"
        elif wire == 1:
            value, i = int.from_bytes(data[i:i + 8], "little"), i + 8
        elif wire == 5:
            value, i = int.from_bytes(data[i:i + 4], "little"), i + 4
        else:
            raise AssertionError(f"wire type {wire} of field {field}")
        out.setdefault(field, []).append(value)
    return out


def one(fields, n, default=None):
    v = fields.get(n)
    return v[-1] if v else default


def read_perfetto(path):
    """A Perfetto trace (trace.proto: repeated TracePacket packet = 1) as the trace processor would
    import the parts gpushim writes: clock snapshot, track descriptors (counter units), counter and
    instant track events, and ProfilePackets resolved to heap dumps of named callstacks."""
    with open(path, "rb") as f:
        trace = proto_fields(f.read())
    assert set(trace) == {1}, trace.keys()
    doc = {"clocks": set(), "tracks": {}, "counters": {}, "instants": [], "dumps": [], "process": None}
    strings, mappings, frames, callstacks, indexes = {}, {}, {}, {}, []
    for raw in trace[1]:
        p = proto_fields(raw)
        ts = one(p, 8)
        assert one(p, 10) == 1, "every packet on the one trusted sequence"
        if 6 in p:  # ClockSnapshot
            doc["clocks"] = {one(proto_fields(c), 1) for c in proto_fields(one(p, 6)).get(1, [])}
        if 2 in p:  # ProcessTree
            proc = proto_fields(one(proto_fields(one(p, 2)), 1))
            doc["process"] = (one(proc, 1), one(proc, 3).decode())
        if 60 in p:  # TrackDescriptor
            d = proto_fields(one(p, 60))
            counter = proto_fields(one(d, 8)) if 8 in d else None
            doc["tracks"][one(d, 1)] = {"name": one(d, 2, b"").decode(), "parent": one(d, 5),
                                        "unit": one(counter, 3) if counter is not None else None,
                                        "pid": one(proto_fields(one(d, 3)), 1) if 3 in d else None}
        if 11 in p:  # TrackEvent
            e = proto_fields(one(p, 11))
            assert one(e, 11) in doc["tracks"], "event on a track never described"
            if one(e, 9) == 4:
                doc["counters"].setdefault(doc["tracks"][one(e, 11)]["name"], []).append((ts, one(e, 30)))
            elif one(e, 9) == 3:
                doc["instants"].append((ts, one(e, 23).decode()))
        if 37 in p:  # ProfilePacket: interning tables first, then the dumps that use them
            pp = proto_fields(one(p, 37))
            indexes.append(one(pp, 7, 0))
            for s in pp.get(1, []):
                s = proto_fields(s)
                strings[one(s, 1)] = one(s, 2, b"").decode()
            for mp in pp.get(4, []):
                mp = proto_fields(mp)
                assert one(mp, 2) in strings, "a mapping's build id must be an interned string"
                mappings[one(mp, 1)] = "/".join(strings[i] for i in mp.get(7, []))
            for fr in pp.get(2, []):
                fr = proto_fields(fr)
                assert one(fr, 3) in mappings and one(fr, 2) in strings
                frames[one(fr, 1)] = (strings[one(fr, 2)], mappings[one(fr, 3)], one(fr, 4, 0))
            for cs in pp.get(3, []):
                cs = proto_fields(cs)
                callstacks[one(cs, 1)] = [frames[i] for i in cs[2]]  # outermost first
            for dump in pp.get(5, []):
                dump = proto_fields(dump)
                samples = []
                for smp in dump.get(2, []):
                    smp = proto_fields(smp)
                    samples.append({"stack": [f[0] for f in callstacks[one(smp, 1)]], "allocated": one(smp, 2, 0),
                                    "freed": one(smp, 3, 0), "allocs": one(smp, 5, 0), "frees": one(smp, 6, 0)})
                doc["dumps"].append({"ts": one(dump, 9), "pid": one(dump, 1), "heap": one(dump, 11).decode(),
                                     "samples": samples, "continued": bool(one(pp, 6, 0))})
    assert indexes == list(range(len(indexes))), "ProfilePacket.index must count up from 0"
    return doc


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
        # By default a function is one frame (its file, no line), however many lines allocate in it.
        ours = [f for f in doc["shared"]["frames"] if f.get("file", "").endswith("train_loop.cpp")]
        self.assertTrue(ours)
        self.assertFalse([f for f in ours if "line" in f])
        self.assertEqual(len([f for f in ours if "forward_backward" in f["name"]]), 1, ours)
        # --lines: one frame per line.
        with open(self.export("speedscope", self.trace, "lines.speedscope.json", "--lines")) as f:
            doc = json.load(f)
        read_speedscope(self, doc)
        lines = {f["line"] for f in doc["shared"]["frames"] if f.get("file", "").endswith("train_loop.cpp")}
        self.assertLessEqual({L["model"], L["activation"], L["scratch"], L["main_model"], L["main_loop"]}, lines)
        # From a report: what is live.
        report = self.export("speedscope", self.recorded.report_path, "report.speedscope.json")
        with open(report) as f:
            [live] = read_speedscope(self, json.load(f))
        self.assertEqual(live["endValue"], self.recorded.device(0)["live_bytes"])

    def test_folded_frames_are_functions_unless_lines_are_asked_for(self):
        peak = self.summary["devices"][0]["peak_allocated"]
        path = self.export("folded", self.trace, "mem.folded")
        with open(path) as f:
            lines = f.read().splitlines()
        # flamegraph.pl merges equal frames: a function that allocates from two lines is one box.
        stacks = [l.rsplit(" ", 1)[0].split(";") for l in lines]
        fb = {fr for s in stacks for fr in s if "forward_backward" in fr}
        self.assertEqual(len(fb), 1, fb)
        self.assertNotIn("train_loop.cpp", " ".join(fb))
        self.assertEqual(len(lines), len(set(l.rsplit(" ", 1)[0] for l in lines)))  # each stack once
        self.assertEqual(sum(int(l.rsplit(" ", 1)[1]) for l in lines), peak)
        path = self.export("folded", self.trace, "lines.folded", "--lines")
        with open(path) as f:
            lines = f.read().splitlines()
        leaves = {l.rsplit(" ", 1)[0].split(";")[-1] for l in lines}
        for line in (L["activation"], L["scratch"]):  # --lines: two lines of one function, two frames
            self.assertTrue(any(re.fullmatch(r".*forward_backward.* \(train_loop\.cpp:%d\)" % line, l) for l in leaves),
                            leaves)
        self.assertEqual(sum(int(l.rsplit(" ", 1)[1]) for l in lines), peak)
        self.assertIn("--countname bytes --colors mem", analyze("export", "--help").stdout)
        p = analyze("export", "--format", "perfetto", self.trace, "-o", os.path.join(self.out, "x"), "--lines", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)

    def test_perfetto_heap_profile_and_counters_in_bytes(self):
        path = self.export("perfetto", self.trace, "mem.pftrace")
        doc = read_perfetto(path)
        dev = self.summary["devices"][0]
        self.assertEqual(doc["clocks"], {3, 4, 6})  # the dumps' MONOTONIC_COARSE maps to trace time
        self.assertEqual(doc["process"], (self.recorded.report["pid"], self.recorded.report["exe"]))
        units = {t["name"]: t["unit"] for t in doc["tracks"].values() if t["unit"] is not None}
        self.assertEqual(units, {"device 0 allocated": 3, "device 0 reserved": 3})  # UNIT_SIZE_BYTES
        allocated = doc["counters"]["device 0 allocated"]
        self.assertEqual([t for t, _ in allocated], sorted(t for t, _ in allocated))
        self.assertEqual(max(v for _, v in allocated), dev["peak_allocated"])
        self.assertEqual(max(v for _, v in doc["counters"]["device 0 reserved"]), dev["peak_reserved"])
        self.assertEqual(sum(1 for _, n in doc["instants"] if n.startswith("iteration ")), self.summary["iterations"])
        # Two dumps of the device's heap: at its peak and at the end, cumulative as heapprofd's are.
        peak, end = doc["dumps"]
        self.assertEqual((peak["heap"], end["heap"]), ("cuda device 0", "cuda device 0"))
        self.assertEqual((peak["continued"], end["continued"]), (True, False))
        self.assertLess(peak["ts"], end["ts"])
        held = lambda d: sum(s["allocated"] - s["freed"] for s in d["samples"])
        self.assertEqual(held(peak), dev["peak_allocated"])
        self.assertEqual(held(end), dev["live_bytes"])
        self.assertEqual(sum(s["allocs"] for s in end["samples"]), dev["total_allocs"])
        self.assertEqual(sum(s["frees"] for s in end["samples"]), dev["total_frees"])
        # Callstacks run outermost first to the allocating line, and two lines stay two frames.
        leaves = {s["stack"][-1] for s in end["samples"]}
        for line in (L["activation"], L["scratch"]):
            self.assertTrue(any(l.endswith(f"(train_loop.cpp:{line})") for l in leaves), leaves)
        self.assertTrue(all(s["stack"][0].startswith("_start") for s in end["samples"]))
        # From a report: one dump of what is live.
        report = read_perfetto(self.export("perfetto", self.recorded.report_path, "report.pftrace"))
        [live] = report["dumps"]
        self.assertEqual(held(live), self.recorded.device(0)["live_bytes"])

    def test_speedscope_opens_both_exports_with_its_own_importer(self):
        # scripts/setup installs both: missing is a broken setup, never a reason to pass without checking
        # (on a GPU machine, whose image is not ours, the test is reported as not run there).
        require_tool(shutil.which("node"), "node", "install Debian's nodejs (scripts/setup)")
        require_tool(os.path.isdir(os.path.join(SPEEDSCOPE, "dist", "release")), "speedscope's npm package",
                     f"not at {SPEEDSCOPE} (run scripts/setup)")
        js = self.export("speedscope", self.trace, "mem.speedscope.json", "--lines")
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
        self.assertEqual(set(fb), {L["activation"], L["scratch"]})
        for line, weight in fb.items():
            self.assertEqual(weight, sum(b for fr, b in at_peak.items() if f"train_loop.cpp:{line}" in fr))
        # The folded file: the same total; unitless by nature of the format (hence --countname).
        self.assertEqual(folded_view["imported_as"], "Importing as collapsed stack format")
        self.assertEqual(folded_view["profiles"][0]["total"], peak)

    def test_perfetto_string_fields_are_utf8_whatever_the_programs_path(self):
        # Protobuf's string fields must hold UTF-8; the process's command line and name were the
        # executable's path as bytes, which on Linux need not be (a directory named in Latin-1).
        odd = os.fsencode(tempfile.mkdtemp(prefix="gpushim-viewers-")) + b"/caf\xe9"
        os.mkdir(odd)
        exe = odd + b"/prog"
        shutil.copy(os.fsencode(program("e2e_leak_two_sites")), exe)
        _, trace = traced([os.fsdecode(exe)])
        doc = read_perfetto(self.export("perfetto", trace, "odd.pftrace"))  # decodes them as UTF-8
        self.assertEqual(doc["process"][1], os.fsdecode(exe).encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        self.assertIn("\ufffd", doc["process"][1])

    def test_a_run_with_nothing_held_exports_what_the_viewers_open(self):
        # A clean run's report (nothing live) and a trace without allocations gave a speedscope file
        # without a profile, which speedscope refuses ("imported nothing"), and an empty folded
        # file, which flamegraph.pl refuses, without a word. The trace is the run's without its
        # events chunks, its end record kept: a run that allocated nothing (one cut before its
        # first events, with no end record, holds nothing to read and is refused: test_traces).
        require_tool(shutil.which("node"), "node", "install Debian's nodejs (scripts/setup)")
        require_tool(os.path.isdir(os.path.join(SPEEDSCOPE, "dist", "release")), "speedscope's npm package",
                     f"not at {SPEEDSCOPE} (run scripts/setup)")
        r, trace = traced([program("e2e_free_everything")])
        self.assertRanOK(r)
        self.assertEqual(r.report["sites"], [])
        with open(trace, "rb") as f:
            data = f.read()
        pos = 8
        while data[pos + 4] != 5:  # up to the first events chunk (type 5)
            pos += 16 + int.from_bytes(data[pos + 8:pos + 12], "little")
        end = pos
        while data[end + 4] != 6:  # the end record (type 6)
            end += 16 + int.from_bytes(data[end + 8:end + 12], "little")
        cut = os.path.join(self.out, "cut.trace")
        with open(cut, "wb") as f:
            f.write(data[:pos] + data[end:])
        for source in (r.report_path, cut):
            with self.subTest(source=source):
                js = self.export("speedscope", source, "empty.speedscope.json")
                proc = subprocess.run(["node", CHECK_SPEEDSCOPE, "--speedscope", SPEEDSCOPE, js], capture_output=True,
                                      text=True, timeout=120)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                [p] = json.loads(proc.stdout)["profiles"]
                self.assertEqual((p["name"], p["total"]), ("device 0: bytes " + (
                    "live at the end" if source == r.report_path else "held at the device's peak"), 0))
                folded = os.path.join(self.out, "empty.folded")
                proc = analyze("export", "--format", "folded", source, "-o", folded)
                self.assertEqual(os.path.getsize(folded), 0)
                self.assertIn("note: no site held memory at ", proc.stderr)
                self.assertIn("flamegraph.pl draws nothing", proc.stderr)


if __name__ == "__main__":
    unittest.main()
