"""End-to-end tests of the summary views made for users of other tools: PyTorch's memory_summary()
table (--format torch), heaptrack's "most allocations" and "temporary allocations" rankings, and
the caller/callee tree of one site (--site N), from one traced run of e2e_train_loop."""
import json
import os
import re
import tempfile
import unittest

from shimtest import ShimTestCase, program
from test_traces import analyze, analyze_json, load_memory_viz, torn_inside, traced

MiB = 1 << 20
KiB = 1 << 10


def train_loop_lines():
    """Lines of tests/e2e/programs/train_loop.cpp the tests name, found by their code, not hard-coded."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "train_loop.cpp")
    wanted = {"model": "cudaMalloc(&p, 16 * kMiB)", "activation": "cudaMallocAsync(&p, bytes, stream) : cudaMalloc",
              "scratch": "cudaMallocAsync(&scratch", "leak": "const cudaError_t e = cudaMalloc(&p, bytes);",
              "main_model": "= load_model();", "main_loop": "forward_backward(stream, it)"}
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            for k, code in wanted.items():
                if code in line and k not in out:
                    out[k] = n
    assert set(out) == set(wanted), out
    return out


L = train_loop_lines()


def torch_table(text):
    """{metric: [cur, peak, alloc, freed]} from a memory_summary()-style table, sizes in bytes;
    None for n/a. Sub-rows are keyed "metric/large" and "metric/small"."""
    units = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": 1 << 30, "TiB": 1 << 40, "": 1, "K": 1000, "M": 1000000}
    rows, metric = {}, None
    for line in text.splitlines():
        m = re.fullmatch(r"\| (.{21}) \|(.{12})\|(.{12})\|(.{12})\|(.{12})\|", line)
        if not m or m.group(1).strip() == "Metric":
            continue
        name = m.group(1).strip()
        cells = []
        for c in m.groups()[1:]:
            c = c.strip()
            if c == "n/a":
                cells.append(None)
                continue
            n = re.fullmatch(r"(\d+) ?(B|KiB|MiB|GiB|TiB|K|M)?", c)
            assert n, (line, c)
            cells.append(int(n.group(1)) * units[n.group(2) or ""])
        if name.startswith("from "):
            rows[metric + "/" + name.split()[1]] = cells
        else:
            metric = name
            rows[name] = cells
    return rows


class SummaryViews(ShimTestCase):
    @classmethod
    def setUpClass(cls):
        # 8 iterations: per iteration 6 temporary activations, one small temporary scratch block and
        # one 1 MiB block kept (the planted leak); the model stays.
        cls.recorded, cls.trace = traced([program("e2e_train_loop"), "8"], env={"GPUSHIM_POLICY": "caching"})
        cls.summary = analyze_json("summary", cls.trace)

    def test_torch_table_from_a_trace_matches_the_events(self):
        text = analyze("summary", "--format", "torch", self.trace).stdout
        self.assertIn("CUDA memory summary, device ID 0", text)
        self.assertIn("| CUDA OOMs: 0", re.sub(r"\s+", " ", text))
        for line in text.splitlines():
            self.assertEqual(len(line), 77, line)  # torch's 75 columns inside the frame
        t = torch_table(text)
        dev = self.summary["devices"][0]
        self.assertEqual(t["Allocations"], [dev["live_count"], t["Allocations"][1], dev["total_allocs"], dev["total_frees"]])
        self.assertEqual(t["Allocated memory"][0], dev["live_bytes"])
        self.assertEqual(t["Allocated memory"][1], dev["peak_allocated"])
        # The pools split every allocation: large (above 1 MiB) plus small is the whole.
        for metric in ("Allocated memory", "Allocations"):
            for col in (0, 2, 3):
                self.assertEqual(t[metric + "/large"][col] + t[metric + "/small"][col], t[metric][col], metric)
        self.assertEqual(t["Allocated memory"][2] - t["Allocated memory"][3], t["Allocated memory"][0])
        self.assertEqual(t["GPU reserved memory"][0], dev["reserved"])
        self.assertEqual(t["GPU reserved segments"][2], t["GPU reserved segments"][0] + t["GPU reserved segments"][3])
        for row in ("Largest free block", "Syncs for reuse", "Unaccounted"):
            self.assertRegex(text, r"\| " + row + r" +\| n/a")  # only a report knows them
        # torch's 11 blocks in its order, every cell known, then the shim's rows in a block of their own.
        blocks = [l.split("|")[1].strip() for l in text.splitlines()
                  if re.fullmatch(r"\| \S.{20} \|.*", l) and not l.startswith("|  ") and "from" not in l]
        torch_blocks = ["Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                        "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments",
                        "Non-releasable allocs", "Oversize allocations", "Oversize GPU segments"]
        self.assertEqual(blocks[:len(torch_blocks)], torch_blocks)
        self.assertEqual(blocks[len(torch_blocks)], "gpushim")
        self.assertIn("Cached free memory", blocks[len(torch_blocks):])
        self.assertNotIn(None, [c for row in t.values() for c in row])
        self.assertEqual(t["Active memory"], t["Allocated memory"])
        self.assertEqual(t["Oversize allocations"], [0, 0, 0, 0])
        # Non-releasable: free parts of segments still in use, never more than what is reserved.
        self.assertLessEqual(t["Non-releasable memory"][1], t["GPU reserved memory"][1])
        self.assertEqual(t["Non-releasable memory"][2] - t["Non-releasable memory"][3], t["Non-releasable memory"][0])
        self.assertIn("KiB", text)  # PyTorch 2's units, not "KB"
        self.assertNotRegex(text, r"\d (KB|MB|GB) ")

    def test_json_leaves_what_a_trace_cannot_know_unknown(self):
        # A trace has no pool's free list: its JSON said largest_free_block 0 and so external
        # fragmentation 1 (100%) while most of the reserve was cached free.
        dev = self.summary["devices"][0]
        self.assertGreater(dev["cached_free"], 0)
        self.assertIsNone(dev["largest_free_block"])
        self.assertIsNone(dev["external_fragmentation"])
        from_report = analyze_json("summary", self.recorded.report_path)["devices"][0]
        reported = self.recorded.device(0)
        self.assertEqual(from_report["largest_free_block"], reported["pool"]["largest_free_block"])
        self.assertAlmostEqual(from_report["external_fragmentation"], reported["external_fragmentation"], places=9)

    def test_report_and_trace_of_one_run_count_the_same_iteration_marks(self):
        # A report's summary said "iterations": 0 (and no marks in its text) while its growth
        # section counted the run's 8 marks, as the trace does.
        self.assertEqual(self.recorded.report["growth"]["iteration_source"], "marks")
        self.assertEqual(self.summary["iterations"], 8)
        self.assertEqual(analyze_json("summary", self.recorded.report_path)["iterations"], 8)
        self.assertIn(", 8 iteration marks", analyze("summary", self.recorded.report_path).stdout.splitlines()[1])
        # Iterations of a GPUSHIM_ITERATION_SITE count too: how many were marks is not known.
        doc = dict(self.recorded.report, growth=dict(self.recorded.report["growth"], iteration_source="marks+site"))
        path = os.path.join(tempfile.mkdtemp(prefix="gpushim-views-"), "site.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        self.assertIsNone(analyze_json("summary", path)["iterations"])

    def test_report_and_trace_of_one_run_give_the_same_times(self):
        def rows(source):
            text = analyze("summary", "--format", "torch", source).stdout
            return {name: float(re.search(r"\| %s +\| (\S+) s " % name, text).group(1)) for name in ("Peak allocated at", "Duration")}
        # The report's peak time and the trace's event time are two clock reads, which a preempted
        # thread can put on either side of a hundredth of a second: one step of the printed figure.
        from_trace, from_report = rows(self.trace), rows(self.recorded.report_path)
        for name in from_trace:
            self.assertAlmostEqual(from_trace[name], from_report[name], delta=0.0101, msg=name)

    def test_torch_table_from_a_report_has_the_shims_rows(self):
        text = analyze("summary", "--format", "torch", self.recorded.report_path).stdout
        t = torch_table(text)
        dev = self.recorded.device(0)
        self.assertEqual(t["Allocations"], [dev["live_count"], t["Allocations"][1], dev["total_allocs"], dev["total_frees"]])
        self.assertEqual(t["GPU reserved segments"][2], dev["pool"]["segment_allocs"])
        self.assertNotIn(None, [c for row in t.values() for c in row])  # every cell, as from the trace
        self.assertEqual(t["Active allocs"], t["Allocations"])
        self.assertIn("cudaMalloc retries: %-8d" % dev["pool"]["alloc_retries"], text)
        self.assertRegex(text, r"\| Largest free block +\| %s" % re.escape(human(dev["pool"]["largest_free_block"])))
        self.assertRegex(text, r"\| Syncs for reuse +\| %d " % dev["pool"]["reuse_syncs"])
        # The row's sentence, wrapped onto rows of its own where it is longer than the table.
        row = re.search(r"\| Unaccounted +\| (.*?) +\|\n((?:\| +\| .*? +\|\n)*)", text)
        self.assertIsNotNone(row, text)
        sentence = " ".join([row.group(1)] + re.findall(r"\| +\| (.*?) +\|\n", row.group(2)))
        self.assertRegex(sentence, r"^\S+ \S+ at \d+\.\d\d s, (\d+\.\d\d s (before|after) the peak|at the peak|"
                                   r"next to the peak in time, not in memory held)$")

    def test_quarantined_memory_is_not_said_to_wait_for_a_sync(self):
        # The pools query events for it and never synchronize for it (docs/report-format.md,
        # quarantined_bytes); the summary said "waiting for a sync" while reuse_syncs was 0.
        doc = json.loads(json.dumps(self.recorded.report))
        pool = doc["devices"][0]["pool"]
        pool["quarantined_bytes"] = 3 << 20
        pool["cached_free_bytes"] = max(pool["cached_free_bytes"], 3 << 20)
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        try:
            text = analyze("summary", path).stdout
        finally:
            os.unlink(path)
        self.assertIn(", quarantined until the work queued before its free is done 3.0 MiB", text)
        self.assertNotIn("sync", text.split("Fragmentation", 1)[1].split("\n\n", 1)[0])

    def test_a_report_without_torch_figures_shows_what_its_counters_hold(self):
        # Reports of shims before the "torch" figures: the cells their counters hold, n/a for the rest.
        doc = dict(self.recorded.report)
        doc["devices"] = [{k: v for k, v in d.items() if k != "torch"} for d in doc["devices"]]
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        try:
            t = torch_table(analyze("summary", "--format", "torch", path).stdout)
        finally:
            os.unlink(path)
        dev = self.recorded.device(0)
        self.assertEqual(t["Allocations"], [dev["live_count"], None, dev["total_allocs"], dev["total_frees"]])
        self.assertEqual(t["Allocated memory"], [dev["live_bytes"], dev["peak_allocated_bytes"], None, None])
        self.assertEqual(t["Allocations/large"], [None] * 4)  # no per-allocation sizes
        self.assertEqual(t["Non-releasable memory"], [None] * 4)
        self.assertEqual(t["GPU reserved segments"][2], dev["pool"]["segment_allocs"])

    def test_most_and_temporary_allocations(self):
        most = self.summary["most_allocations"]
        self.assertEqual(most[0]["allocs"], 48)
        self.assertIn(f"train_loop.cpp:{L['activation']}", most[0]["frames"][0])
        self.assertEqual(sum(s["allocs"] for s in most), self.summary["devices"][0]["total_allocs"])
        temporary = {s["frames"][0].split()[-2]: s["temporary"] for s in self.summary["temporary_allocations"]}
        self.assertEqual(temporary, {f"train_loop.cpp:{L['activation']}": 48,
                                     f"train_loop.cpp:{L['scratch']}": 8})  # not the leak, not the model
        text = analyze("summary", self.trace).stdout
        self.assertIn("Most allocations\n  #1 48 allocations", text)
        self.assertIn("Temporary allocations (freed within 10 ms or in the iteration that made them)\n"
                      "  #1 48 temporary of 48 allocations (100%)", text)
        # A report counts only what is live: it says where to get the rankings.
        self.assertIn("traces only", analyze("summary", self.recorded.report_path).stdout)
        self.assertEqual(analyze("summary", self.trace, "--temporary-ms", "x", check=False).returncode, 2)

    def test_site_tree_shows_callers_and_callees_of_the_sites_function(self):
        at_peak = self.summary["at_peak_sites"]
        n = next(i for i, s in enumerate(at_peak) if "forward_backward" in s["frames"][0]) + 1
        text = analyze("summary", self.trace, "--site", str(n)).stdout
        self.assertIn("forward_backward", text.splitlines()[1])
        callers = text.split("Callers")[1].split("Callees")[0]
        callees = text.split("Callees")[1]
        self.assertRegex(callers, r"└─ [\d.]+ MiB, 56 allocations  main train_loop.cpp:%d" % L["main_loop"])
        # Both lines of the function that allocate, each with its own count.
        self.assertRegex(callees, r"48 allocations  \(allocates here\) line %d" % L["activation"])
        self.assertRegex(callees, r"8 allocations  \(allocates here\) line %d" % L["scratch"])
        bad = analyze("summary", self.trace, "--site", "999", check=False)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("--site 999", bad.stderr)


def torch_rows_of(text):
    """torch's own table, up to the shim's block."""
    return text.split("| gpushim  ")[0].splitlines()


class TorchTableOfReportAndTrace(ShimTestCase):
    """One run writes a report and a trace: both give the same memory_summary() table, cell for
    cell, under every policy (the core keeps torch_stats.h's figures as it accounts, the analysis
    computes them from the events by the same rules)."""

    def check(self, policy, args, split_from_report=True, env=None):
        recorded, trace = traced(args, env={"GPUSHIM_POLICY": policy, **(env or {})})
        from_trace = analyze("summary", "--format", "torch", trace).stdout
        from_report = analyze("summary", "--format", "torch", recorded.report_path).stdout
        self.assertIn("torch", recorded.device(0))
        if split_from_report:
            self.assertEqual(torch_rows_of(from_report), torch_rows_of(from_trace), policy)
            self.assertNotIn("n/a", "".join(torch_rows_of(from_report)))
            return from_report, from_trace
        # vmm: the arena does not say where its blocks lie, so the report has no non-releasable
        # figures (torch_stats.h); every other row is the trace's.
        t, r = torch_table(from_trace), torch_table(from_report)
        self.assertEqual(r["Non-releasable memory"], [None] * 4)
        self.assertEqual(r["Non-releasable allocs"], [None] * 4)
        for name in t:
            if not name.startswith("Non-releasable"):
                self.assertEqual(r[name], t[name], (policy, name))
        self.assertNotIn("inactive_split", recorded.device(0)["torch"])
        return from_report, from_trace

    def test_caching(self):
        self.check("caching", [program("e2e_train_loop"), "8"])

    def test_caching_with_mixed_sizes_and_streams(self):
        self.check("caching", [program("e2e_cycling_shapes")])

    def test_caching_under_a_cap_with_driver_memory_and_ooms(self):
        # Segments given back on the out-of-memory retry, a driver-API allocation past the pool.
        from_report, from_trace = self.check("caching", [program("e2e_cap_and_oom"), "48", "100", "20", "2"],
                                             env={"FAKECUDA_MEM": "1GiB", "GPUSHIM_LIMIT": "300MiB"})
        # The pool's retries: kept by the report and by the trace's end chunk alike.
        self.assertRegex(from_trace, r"cudaMalloc retries: [1-9]")

    def test_caching_with_max_split_counts_oversize_blocks(self):
        recorded, trace = traced([program("e2e_train_loop"), "8", "--leak-mib", "24"],
                                 env={"GPUSHIM_POLICY": "caching", "GPUSHIM_MAX_SPLIT": "22MiB"})
        r = torch_table(analyze("summary", "--format", "torch", recorded.report_path).stdout)
        t = torch_table(analyze("summary", "--format", "torch", trace).stdout)
        self.assertEqual(r, t)
        self.assertGreater(r["Oversize allocations"][2], 0)  # the 24 MiB leaked blocks
        self.assertGreater(r["Oversize GPU segments"][2], 0)

    def test_caching_with_threads(self):
        # Exact under concurrency too: the trace numbers pool operations in the pool's lock order,
        # the order the core's figures move in.
        self.check("caching", [program("e2e_threads_alloc")])

    def test_passthrough(self):
        self.check("passthrough", [program("e2e_train_loop"), "8"])

    def test_vmm(self):
        self.check("vmm", [program("e2e_train_loop"), "8"], split_from_report=False)

    def test_vmm_reserves_memory_mapped_twice_once(self):
        # Shapes that change make the arena lend chunk ends, mapping memory at a second address:
        # the device holds it once, and so do torch's reserved figures and the trace's events.
        recorded, trace = traced([program("e2e_cycling_shapes")], env={"GPUSHIM_POLICY": "vmm"})
        self.check("vmm", [program("e2e_cycling_shapes")], split_from_report=False)
        dev = recorded.device(0)
        self.assertGreater(dev["pool"]["mapped_bytes"], dev["pool"]["reserved_bytes"])  # the case at hand
        reserved = dev["torch"]["reserved_bytes"]["all"]
        self.assertEqual(reserved["current"], dev["pool"]["reserved_bytes"])
        self.assertEqual(reserved["peak"], dev["peak_reserved_bytes"])
        summary = json.loads(analyze("summary", "--json", trace).stdout)
        self.assertEqual(summary["devices"][0]["peak_reserved"], dev["peak_reserved_bytes"])
        self.assertEqual(summary["devices"][0]["reserved"], dev["pool"]["reserved_bytes"])
        # From the events themselves, not from the end record's figures that correct them.
        self.assertFalse([n for n in summary["notes"] if "events account for" in n], summary["notes"])
        # memory-viz draws each mapping as a segment, so its total is above the reserved figure by
        # the memory mapped twice; the export says by how much.
        snap_path = os.path.join(os.path.dirname(trace), "snap.pickle")
        r = analyze("export", "--format", "memory-viz", trace, "-o", snap_path)
        drawn = sum(s["total_size"] for s in load_memory_viz(self, snap_path)["segments"] if s["device"] == 0)
        self.assertGreater(drawn, dev["pool"]["reserved_bytes"])
        m = re.search(r"note: device 0: up to (\S+ \S+) of the segments \((\S+ \S+) at the end\) was memory mapped "
                      r"at two addresses", r.stderr)
        self.assertTrue(m, r.stderr)
        self.assertEqual(m.group(2), human(drawn - dev["pool"]["reserved_bytes"]))

    def test_a_trace_cut_short_says_so(self):
        # What was recorded, and the reader's note on stderr: the table alone looks like a whole run.
        recorded, trace = traced([program("e2e_train_loop"), "8"], env={"GPUSHIM_POLICY": "caching"})
        with open(trace, "rb") as f:
            data = f.read()
        cut = trace + ".cut"
        with open(cut, "wb") as f:
            f.write(data[:torn_inside(data, len(data) * 2 // 3)])
        whole = analyze("summary", "--format", "torch", trace)
        self.assertNotIn("cut short", whole.stderr)
        r = analyze("summary", "--format", "torch", cut)
        self.assertIn("note: the trace is cut short", r.stderr)
        self.assertIn("cudaMalloc retries: n/a", r.stdout)  # the end chunk is what holds them
        self.assertIn("| Allocated memory ", r.stdout)


def human(b):
    """gpushim's "12.0 MiB" rendering (util/units)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if b >= size:
            return "%.1f %s" % (b / size, unit)
    return "%d B" % b


if __name__ == "__main__":
    unittest.main()
