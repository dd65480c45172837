"""gpushim-analyze diff and merge: per-site and per-device changes between two runs, one table
across the ranks of a job, and what each says about inputs that are cut short, compressed, of
another policy, on other devices, or hold figures near 2^64. Moved out of test_traces.py, which
had grown past 1,000 lines."""
import gzip
import json
import os
import subprocess
import tempfile
import unittest

from pythons import interpreters
from shimtest import ShimTestCase, last_json, program, run
from test_traces import ANALYZE, LEAK_PY, MiB, analyze, analyze_json, torn_inside, traced


def report_doc(pid, rank, devices, sites, reason="exit"):
    """A minimal report as the shim writes it (docs/report-format.md)."""
    return {"schema": "gpushim-report/1", "pid": pid, "exe": "/opt/train", "host": f"node{pid % 4}", "rank": rank,
            "policy": "caching", "reason": reason, "wall_time_s": 1.0e9, "duration_s": 100.0, "stack_depth": 32,
            "devices": [{"device": d, "live_bytes": live, "live_count": 1, "peak_allocated_bytes": peak,
                         "peak_allocated_at_s": 1.0, "peak_reserved_bytes": reserved, "total_allocs": 10,
                         "total_frees": 9, "failed_allocs": 0, "capacity_bytes": 80 << 30, "limit_bytes": 0,
                         "pool": {"reserved_bytes": reserved}} for d, live, peak, reserved in devices],
            "other_memory": [], "invalid_frees": 0, "distinct_stacks": 3, "shim_host_bytes": 1000, "ooms": [],
            "sites": [{"device": 0, "kind": "device", "live_bytes": live, "live_count": 1, "stack_id": i + 1,
                       "frames": [{"function": fn, "file": "/src/train.cpp", "line": line, "module": "/opt/train",
                                   "address": 0x1000 + i, "module_offset": 0x10 + i, "kind": "native"}]}
                      for i, (fn, line, live) in enumerate(sites)], "timeline": []}


class DiffAndMerge(ShimTestCase):
    def write(self, doc):
        fd, path = tempfile.mkstemp(suffix=".json", dir=self.dir)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        return path

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpushim-merge-")

    def test_diff_gives_known_per_site_changes(self):
        a = self.write(report_doc(1, "0", [(0, 45 * MiB, 100 * MiB, 128 * MiB)],
                                  [("grow()", 10, 10 * MiB), ("gone()", 20, 5 * MiB), ("same()", 30, 30 * MiB)]))
        b = self.write(report_doc(2, "0", [(0, 67 * MiB, 120 * MiB, 160 * MiB)],
                                  [("grow()", 10, 30 * MiB), ("new()", 40, 7 * MiB), ("same()", 30, 30 * MiB)]))
        out = analyze_json("diff", a, b)
        dev = out["devices"][0]
        self.assertEqual(dev["peak_allocated_delta"], 20 * MiB)
        self.assertEqual(dev["peak_reserved_delta"], 32 * MiB)
        self.assertEqual(dev["live_delta"], 22 * MiB)
        sites = {s["frames"][0].split()[0]: s for s in out["sites"]}
        self.assertEqual(set(sites), {"grow()", "gone()", "new()"})  # unchanged sites are left out
        self.assertEqual(sites["grow()"]["status"], "changed")
        self.assertEqual(sites["grow()"]["live_delta"], 20 * MiB)
        self.assertEqual(sites["gone()"]["status"], "gone")
        self.assertEqual(sites["gone()"]["live_delta"], -5 * MiB)
        self.assertEqual(sites["new()"]["status"], "new")
        self.assertEqual(sites["new()"]["live_delta"], 7 * MiB)
        self.assertIsNone(sites["grow()"]["peak_delta"])  # reports keep no per-site peaks
        self.assertEqual([s["frames"][0].split()[0] for s in out["sites"]], ["grow()", "new()", "gone()"])
        text = analyze("diff", a, b).stdout
        self.assertIn("+20.0 MiB", text)

    def test_diff_of_two_traces_has_site_peaks(self):
        _, a = traced([program("e2e_train_loop"), "5"])
        _, b = traced([program("e2e_train_loop"), "12"])
        out = analyze_json("diff", a, b)
        leak = next(s for s in out["sites"] if "leaky_step" in s["frames"][0])
        self.assertEqual(leak["live_delta"], 7 * MiB)
        self.assertEqual(leak["peak_delta"], 7 * MiB)

    def test_merge_flags_the_odd_rank(self):
        noise = [0, 3, -2, 1, -1, 2, 0, -3]
        for rank in range(8):
            peak = (10 << 30) + noise[rank] * MiB + (4 << 30 if rank == 5 else 0)
            live = 2 << 30 if rank != 2 else 6 << 30
            self.write(report_doc(100 + rank, str(rank), [(0, live, peak, peak + (1 << 30))],
                                  [("model()", 10, live)], reason="snapshot" if rank == 7 else "exit"))
        with open(os.path.join(self.dir, "notes.txt"), "w") as f:
            f.write("not a report\n")
        out = analyze_json("merge", self.dir)
        rows = {r["rank"]: r for r in out["rows"]}
        self.assertEqual(sorted(rows), [str(r) for r in range(8)])
        self.assertEqual([r["rank"] for r in out["rows"]], [str(r) for r in range(8)])
        flagged = {r["rank"]: r["outliers"] for r in out["rows"] if r["outlier"]}
        self.assertEqual(set(flagged), {"2", "5"})
        self.assertTrue(any(o.startswith("peak allocated +40%") for o in flagged["5"]), flagged)
        self.assertTrue(any(o.startswith("live at end +200%") for o in flagged["2"]), flagged)
        self.assertEqual(rows["7"]["reason"], "snapshot")
        self.assertIn("model()", rows["0"]["suspect"])
        self.assertEqual(len(out["skipped"]), 1)
        text = analyze("merge", self.dir).stdout
        self.assertIn("2 outlier run(s)", text)
        self.assertIn("[snapshot]", text)

    def test_merge_of_a_directory_reads_the_directories_below_it(self):
        # A job's reports kept a directory per node: all of them are rows, not only the top level's.
        # A link back up the tree is followed once.
        for node in range(2):
            os.makedirs(os.path.join(self.dir, f"node{node}"))
            for local in range(2):
                rank = 2 * node + local
                path = self.write(report_doc(200 + rank, str(rank), [(0, 1 << 30, 2 << 30, 3 << 30)],
                                             [("model()", 10, 1 << 30)]))
                os.rename(path, os.path.join(self.dir, f"node{node}", f"rank{rank}.json"))
        os.symlink("..", os.path.join(self.dir, "node1", "up"))
        out = analyze_json("merge", self.dir)
        self.assertEqual(sorted(r["rank"] for r in out["rows"]), ["0", "1", "2", "3"])
        self.assertEqual(out["skipped"], [])

    def test_merge_of_directories_without_a_run_names_them(self):
        # `merge emptyd` said "no reports or traces found", not where it looked.
        empty = os.path.join(self.dir, "emptyd")
        os.makedirs(empty)
        p = analyze("merge", empty, check=False)
        self.assertEqual((p.returncode, p.stdout), (1, ""), p.stderr)
        self.assertEqual(p.stderr, f"gpushim-analyze merge: no reports or traces found in {empty} (it holds no files)\n")
        other = os.path.join(self.dir, "notes")
        os.makedirs(other)
        with open(os.path.join(other, "notes.txt"), "w") as f:
            f.write("not a report\n")
        p = analyze("merge", empty, other, check=False)
        self.assertEqual((p.returncode, p.stdout), (1, ""), p.stderr)
        self.assertEqual(p.stderr, f"gpushim-analyze merge: no reports or traces found in {empty} or {other} (1 file "
                                   "there, none a report or trace that reads)\n")

    def test_merge_says_why_it_skips_a_damaged_report_and_exits_1(self):
        for rank in range(3):
            self.write(report_doc(200 + rank, str(rank), [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        damaged = os.path.join(self.dir, "rank3.json")
        with open(damaged, "w") as f:
            f.write('{"schema":"gpushim-report/1","pid":7,"devices":[{"device":"zero"')  # cut short
        with open(os.path.join(self.dir, "notes.txt"), "w") as f:
            f.write("not a report\n")
        blob = os.path.join(self.dir, "core.bin")
        with open(blob, "wb") as f:
            f.write(b"\x00\x01\x02 neither JSON nor a trace")
        p = analyze("merge", self.dir, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)  # the damaged report, not the unrelated file
        self.assertTrue(lines[0].startswith("gpushim-analyze merge: skipping a damaged report or trace: "), lines[0])
        self.assertIn(damaged, lines[0])
        self.assertIn("unexpected end of input", lines[0])
        self.assertIn("3 runs", p.stdout)  # the table of what did read still comes
        self.assertIn("notes.txt (", p.stdout)  # skipped, with its reason
        # The reason does not name the file a second time.
        skipped = [l for l in p.stdout.splitlines() if l.startswith("skipped: " + blob)]
        self.assertEqual(skipped, [f"skipped: {blob} (neither a gpushim report (JSON) nor a gpushim trace)"], p.stdout)

    def test_merge_says_why_it_skips_a_damaged_compressed_report(self):
        # Ranks' files kept compressed: a damaged .json.gz did not look like ours (its head is
        # gzip), so it was skipped like an unrelated file, without a word on stderr, and exit 0.
        for rank in range(3):
            with gzip.open(os.path.join(self.dir, f"rank{rank}.json.gz"), "wt") as f:
                json.dump(report_doc(300 + rank, str(rank), [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]), f)
        with open(os.path.join(self.dir, "rank2.json.gz"), "rb") as f:
            whole = f.read()
        with open(os.path.join(self.dir, "rank2.json.gz"), "wb") as f:
            f.write(whole[:len(whole) // 2])
        with gzip.open(os.path.join(self.dir, "notes.txt.gz"), "wt") as f:
            f.write("not a report\n")
        p = analyze("merge", self.dir, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr.splitlines(), ["gpushim-analyze merge: skipping a damaged report or trace: "
                                                 f"{self.dir}/rank2.json.gz: gzip data cut short"])
        self.assertIn("2 runs", p.stdout)

    def test_a_runs_report_and_trace_agree_on_peak_reserved(self):
        # Under passthrough, cudaMallocAsync goes to CUDA's own pool, which reserves beyond what is
        # allocated; the shim counts that reservation, the trace's events cannot show it, and the
        # trace's end record holds the shim's figure: summary used the events alone (199.0 MiB
        # against the report's 228.0 MiB), so diff of one run's report and trace said -29.0 MiB.
        r, trace = traced([program("e2e_train_loop")], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        dev = r.report["devices"][0]
        self.assertGreater(dev["peak_reserved_bytes"], dev["peak_allocated_bytes"])  # the case at hand
        out = analyze_json("summary", trace)
        self.assertEqual(out["devices"][0]["peak_reserved"], dev["peak_reserved_bytes"])
        self.assertTrue(any("end record" in n for n in out["notes"]), out["notes"])
        diff = analyze_json("diff", r.report_path, trace)["devices"][0]
        self.assertEqual((diff["peak_reserved_delta"], diff["peak_allocated_delta"]), (0, 0), diff)

    def test_a_python_runs_report_and_trace_count_live_memory_at_the_teardowns_start(self):
        # A Python program's report counts live memory when the interpreter's teardown began, its
        # trace counted it after what the teardown freed: diff of one run's two files said every
        # site whose memory a global's __del__ freed had "changed" (a note then said why). Since
        # trace format 1.5 the end record says when the teardown began, and the trace's live
        # figures are of that moment too.
        script = os.path.join(self.dir, "held_by_a_global.py")
        with open(script, "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {os.path.dirname(LEAK_PY)!r})\n"
                    "import ctypes\nfrom cuda_ctypes import MiB, check, cuda\n"
                    "class Buffer:\n"
                    "    def __init__(self):\n"
                    "        self.p = ctypes.c_void_p()\n"
                    "        check(cuda.cudaMalloc(ctypes.byref(self.p), 4 * MiB))\n"
                    "    def __del__(self):\n"
                    "        cuda.cudaFree(self.p)\n"
                    "HELD = [Buffer() for _ in range(3)]\n")
        r, trace = traced([interpreters()[0][0], script])
        self.assertRanOK(r)
        self.assertEqual((r.report["teardown"]["observed"], r.report["teardown"]["freed_bytes"]), (True, 12 * MiB))
        out = analyze_json("diff", r.report_path, trace)
        self.assertEqual(out["devices"][0]["live_delta"], 0)
        self.assertEqual(out["sites"], [])  # nothing changed: one run
        self.assertEqual((out["notes_a"], out["notes_b"]), ([], []))
        reverse = analyze_json("diff", trace, r.report_path)
        self.assertEqual((reverse["devices"][0]["live_delta"], reverse["notes_a"], reverse["notes_b"]), (0, [], []))
        summary = analyze("summary", trace).stdout
        self.assertIn("live when the teardown began 12.0 MiB in 3 allocations", summary)
        self.assertIn("and then freed 12.0 MiB in 3 allocations", summary)
        self.assertEqual(analyze_json("summary", trace)["devices"][0]["live_bytes"], 12 * MiB)
        # A native program has no teardown: nothing to say.
        r, trace = traced([program("e2e_leak_two_sites")])
        self.assertEqual(analyze_json("diff", r.report_path, trace)["notes_a"], [])

    def test_a_runs_report_and_trace_agree_on_reserved_at_the_end(self):
        # A pool of CUDA's own keeps 32 MiB it no longer uses (release threshold max) to the end:
        # held from the driver, in the report's reserved, in no event. The end record had only the
        # peak, so summary said "at the end reserved 0 B" where the report said 32 MiB.
        r, trace = traced([program("e2e_cuda_pool_slack_peak")], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        slack = last_json(r)["slack"]
        dev = r.report["devices"][0]
        self.assertEqual(dev["pool"]["reserved_bytes"], slack)
        self.assertGreater(slack, dev["live_bytes"])  # the case at hand
        out = analyze_json("summary", trace)
        self.assertEqual(out["devices"][0]["reserved"], slack)
        self.assertEqual(out["devices"][0]["cached_free"], slack)
        self.assertTrue(any(n.startswith("device 0: reserved at the end ") for n in out["notes"]), out["notes"])
        self.assertEqual(slack, 32 * MiB)  # the simulated device's chunk, as the report says
        self.assertIn("at the end reserved 32.0 MiB, of it cached free 32.0 MiB", analyze("summary", trace).stdout)

    def test_diff_of_a_runs_report_and_trace_invents_no_site_peaks(self):
        # A report has no per-site peaks, and lists only sites with live memory: the trace's sites
        # with none live at the end were "new" with "site peak 0 B -> 48.0 MiB".
        r, trace = traced([program("e2e_demo_training_loop")])
        self.assertRanOK(r)
        out = analyze_json("diff", r.report_path, trace)
        self.assertEqual(out["sites"], [])
        for a, b in ((r.report_path, trace), (trace, r.report_path)):
            out = analyze_json("diff", "--all", a, b)
            self.assertTrue(out["sites"])
            for s in out["sites"]:
                self.assertEqual(s["status"], "same", s)
                self.assertIsNone(s["peak_delta"], s)
            text = analyze("diff", a, b).stdout
            self.assertNotIn(", site peak", text)
            self.assertIn("no site changed", text)

    def test_merge_counts_a_runs_report_and_trace_once(self):
        # With GPUSHIM_REPORT and GPUSHIM_TRACE both on, each rank leaves two files: three ranks
        # were "6 runs", two rows per rank; and the same file given three times was "3 runs".
        job = tempfile.mkdtemp(prefix="gpushim-job-")
        for rank in range(3):
            r = run([program("e2e_leak_two_sites")], workdir=job, expect_report=False,
                    env={"RANK": str(rank), "GPUSHIM_SUMMARY": "0", "GPUSHIM_REPORT": "run.%r.json",
                         "GPUSHIM_TRACE": "run.%r.trace"})
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(os.listdir(job)), 6)
        out = analyze_json("merge", job)
        self.assertEqual([row["rank"] for row in out["rows"]], ["0", "1", "2"])
        for row in out["rows"]:
            self.assertEqual(row["source"], "report")
            self.assertEqual(row["also"], [os.path.join(job, "run.%s.trace" % row["rank"])])
        self.assertEqual(out["skipped"], [])
        text = analyze("merge", job).stdout
        self.assertTrue(text.startswith("gpushim merge: 3 runs;"), text)
        self.assertEqual(text.count("same run: "), 3, text)
        # The trace alone, then its report: the report still gives the row.
        rep0, tr0 = os.path.join(job, "run.0.json"), os.path.join(job, "run.0.trace")
        out = analyze_json("merge", tr0, rep0)
        self.assertEqual([(row["source"], row["also"]) for row in out["rows"]], [("report", [tr0])])
        # The same file given three times (once by another name) counts once.
        link = os.path.join(job, "..", os.path.basename(job), "run.0.json")
        p = analyze("merge", rep0, rep0, link)
        self.assertTrue(p.stdout.startswith("gpushim merge: 1 run;"), p.stdout)
        self.assertEqual(p.stdout.count("counted once"), 2, p.stdout)
        # Different runs of one rank (another pid, another start) stay apart.
        self.assertEqual(len(analyze_json("merge", rep0, os.path.join(job, "run.1.json"))["rows"]), 2)

    def test_a_result_that_cannot_be_written_is_said(self):
        # To a full disk or a closed stdout, summary, diff, merge and replay exited 1 without a word
        # (export said it): a script saw a failure with no reason, or in a pipeline none at all.
        a = self.write(report_doc(1, "0", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        b = self.write(report_doc(2, "1", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        _, trace = traced([program("e2e_leak_two_sites")])
        for args in (["summary", a], ["summary", "--json", a], ["summary", "--format", "torch", a], ["diff", a, b],
                     ["merge", a, b], ["merge", "--json", a, b], ["replay", trace], ["replay", "--json", trace]):
            for name, stdout in (("full", "/dev/full"), ("closed", None)):
                with self.subTest(args=args, stdout=name):
                    with open(stdout or os.devnull, "w") as out:
                        p = subprocess.run([ANALYZE, *args], stdout=out, stderr=subprocess.PIPE, text=True,
                                           timeout=120, preexec_fn=None if stdout else lambda: os.close(1))
                    self.assertEqual(p.returncode, 1, p.stderr)
                    why = "No space left on device" if stdout else "Bad file descriptor"
                    self.assertEqual(p.stderr, f"gpushim-analyze {args[0]}: cannot write to stdout: {why}\n")

    def test_diff_and_merge_say_when_an_input_is_cut_short(self):
        # A trace of a rank killed mid-run compared as if complete: diff printed "peak allocated
        # 0 B -> 193.9 MiB" and merge a row of 0 B with nothing to say that the trace ends early
        # (summary and replay said it; diff and merge dropped the readers' notes).
        r, trace = traced([program("e2e_demo_training_loop")])
        self.assertRanOK(r)
        with open(trace, "rb") as f:
            data = f.read()
        cut = os.path.join(self.dir, "killed.trace")
        with open(cut, "wb") as f:
            f.write(data[:torn_inside(data, len(data) // 2)])
        why = "the trace is cut short"
        out = analyze_json("diff", cut, r.report_path)
        self.assertTrue(any(n.startswith(why) for n in out["notes_a"]), out["notes_a"])
        self.assertEqual(out["notes_b"], [])
        lines = analyze("diff", cut, r.report_path).stdout.splitlines()
        self.assertTrue(lines[3].startswith("  note on A: " + why), lines)
        self.assertFalse([l for l in lines if l.startswith("  note on B")], lines)
        whole = self.write(report_doc(5, "1", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        rows = {row["path"]: row for row in analyze_json("merge", cut, whole)["rows"]}
        self.assertEqual(rows[cut]["reason"], "truncated")
        self.assertTrue(any(n.startswith(why) for n in rows[cut]["notes"]), rows[cut])
        self.assertEqual(rows[whole]["notes"], [])
        text = analyze("merge", cut, whole).stdout
        pid = r.report["pid"]
        row = next(l for l in text.splitlines() if l.startswith("pid %d " % pid))
        self.assertTrue(row.endswith(" [cut short]"), row)
        self.assertIn("note (pid %d): %s" % (pid, why), text)

    def test_merge_sums_a_runs_devices_in_every_column(self):
        # A rank on two devices had the highest device's peak beside both devices' live memory:
        # 'peak allocated 61.0 MiB, live at end 90.0 MiB' (and peak reserved from whichever device
        # reserved most), live above peak.
        two = self.write(report_doc(1, "0", [(0, 30 * MiB, 31 * MiB, 42 * MiB), (1, 60 * MiB, 61 * MiB, 82 * MiB)],
                                    [("x()", 1, 90 * MiB)]))
        one = self.write(report_doc(2, "1", [(0, 30 * MiB, 31 * MiB, 42 * MiB)], [("x()", 1, 30 * MiB)]))
        rows = {row["rank"]: row for row in analyze_json("merge", two, one)["rows"]}
        self.assertEqual((rows["0"]["peak_allocated"], rows["0"]["peak_reserved"], rows["0"]["live"]),
                         (92 * MiB, 124 * MiB, 90 * MiB))
        self.assertEqual((rows["0"]["devices"], rows["0"]["peak_device"]), (2, 1))
        self.assertEqual((rows["1"]["peak_allocated"], rows["1"]["peak_reserved"], rows["1"]["live"], rows["1"]["devices"]),
                         (31 * MiB, 42 * MiB, 30 * MiB, 1))
        text = analyze("merge", two, one).stdout.splitlines()
        self.assertTrue(text[2].startswith("rank 0 ") and text[2].endswith(" [2 devices]"), text)
        self.assertIn("92.0 MiB", text[2])
        self.assertNotIn("devices]", text[3])

    def test_merge_keeps_a_row_with_a_long_suspect_on_its_line(self):
        # A row was formatted into 512 bytes: a suspect's frame past that cut the row's marks and
        # its newline, and the next line ("no outliers") ran into it.
        name = "ns::" + "Layer<" * 80 + "float" + ">" * 80 + "::forward"
        long = self.write(report_doc(1, "0", [(0, MiB, 2 * MiB, 4 * MiB)], [(name, 1, MiB)], reason="snapshot"))
        lines = analyze("merge", long).stdout.splitlines()
        self.assertTrue(lines[2].startswith("rank 0 "), lines)
        self.assertTrue(lines[2].endswith(name + " train.cpp:1 (train) [snapshot]"), lines[2][-100:])
        self.assertEqual(lines[3], "no outliers")

    def test_diff_of_figures_past_2_63_keeps_its_sign(self):
        # Deltas were int64 casts of uint64 figures subtracted: 16 EiB -> 1 MiB was "+1.0 MiB".
        top = (1 << 64) - 1
        a = self.write(report_doc(1, "0", [(0, top, top, top)], [("x()", 1, top)]))
        b = self.write(report_doc(2, "0", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        out = analyze_json("diff", a, b)
        dev = out["devices"][0]
        self.assertEqual((dev["live_delta"], dev["peak_allocated_delta"]), (-(1 << 63), -(1 << 63)))
        self.assertEqual(out["sites"][0]["live_delta"], -(1 << 63))
        self.assertEqual(analyze_json("diff", b, a)["devices"][0]["live_delta"], (1 << 63) - 1)
        text = analyze("diff", a, b).stdout
        self.assertIn("live 16.0 EiB -> 1.0 MiB (-16.0 EiB)", text)

    def test_merge_marks_a_run_under_another_policy(self):
        # A rank run under vmm among caching ranks was flagged on peak reserved with nothing to say
        # that its policy, not its program, made the difference.
        for rank in range(4):
            doc = report_doc(10 + rank, str(rank), [(0, MiB, 100 * MiB, (100 if rank == 3 else 140) * MiB)],
                             [("x()", 1, MiB)])
            doc["policy"] = "vmm" if rank == 3 else "caching"
            self.write(doc)
        rows = analyze_json("merge", self.dir)["rows"]
        self.assertEqual([r["policy"] for r in rows], ["caching"] * 3 + ["vmm"])
        lines = analyze("merge", self.dir).stdout.splitlines()
        marked = [l for l in lines if l.endswith(" [policy vmm]")]
        self.assertEqual(len(marked), 1, lines)
        self.assertTrue(marked[0].startswith("rank 3 "), marked)
        self.assertFalse([l for l in lines if "[policy caching]" in l], lines)

    def test_diff_of_two_ranks_on_their_own_gpus_compares_device_with_device(self):
        # Rank 0 on device 0 and rank 1 on device 1 (LOCAL_RANK's choice): every site was "gone"
        # from device 0 and "new" on device 1, each device 100% up or down.
        a = self.write(report_doc(1, "0", [(0, 10 * MiB, 20 * MiB, 32 * MiB)], [("x()", 1, 10 * MiB)]))
        doc = report_doc(2, "1", [(1, 12 * MiB, 20 * MiB, 32 * MiB)], [("x()", 1, 12 * MiB)])
        doc["sites"][0]["device"] = 1
        b = self.write(doc)
        out = analyze_json("diff", a, b)
        self.assertEqual([(d["device"], d["device_b"], d["live_delta"], d["peak_allocated_delta"]) for d in out["devices"]],
                         [(0, 1, 2 * MiB, 0)])
        self.assertEqual([(s["status"], s["live_delta"]) for s in out["sites"]], [("changed", 2 * MiB)])
        text = analyze("diff", a, b).stdout
        self.assertIn("A's device 0 is compared with B's device 1", text)
        self.assertIn("  device 0 (B: device 1): peak allocated 20.0 MiB -> 20.0 MiB (0 B)", text)
        # Several devices on a side: by ordinal, as before.
        doc["devices"].append(dict(doc["devices"][0], device=0))
        out = analyze_json("diff", a, self.write(doc))
        self.assertEqual([(d["device"], d["device_b"]) for d in out["devices"]], [(0, 0), (1, 1)])

    def test_merge_of_figures_near_2_64_saturates(self):
        # A damaged report's figures reach 2^64 - 1 (the reader accepts it): two devices' sum
        # wrapped to 2^64 - 2, and the median, back from double (2^64), was an undefined cast.
        top = (1 << 64) - 1
        path = self.write(report_doc(1, "0", [(0, top, top, top), (1, top, top, top)], [("x()", 1, top)]))
        out = analyze_json("merge", path)
        row = out["rows"][0]
        self.assertEqual((row["peak_allocated"], row["peak_reserved"], row["live"]), (top, top, top))
        self.assertEqual(out["medians"], {"peak allocated": top, "peak reserved": top, "live at end": top})
        self.assertIn("median peak allocated 16.0 EiB", analyze("merge", path).stdout)

    def test_merge_tells_apart_pods_whose_processes_share_a_pid(self):
        # Every container's process can be pid 1, and pod names differ at their end: the host
        # column, cut to 12 characters, gave three rows "pid 1  trainer-7f9c" alike.
        for i in range(3):
            doc = report_doc(1, "", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)], reason="snapshot")
            doc["host"] = f"trainer-7f9c8d-worker-{i}"
            self.write(doc)
        lines = analyze("merge", self.dir).stdout.splitlines()
        rows = [l for l in lines if l.startswith("pid 1 ")]
        self.assertEqual(len(rows), 3, lines)
        self.assertEqual(sorted(r.split()[2] for r in rows), [f"trainer-7f9c8d-worker-{i}" for i in range(3)])
        self.assertEqual(lines[1].split()[:2], ["run", "host"])
        for row in rows:  # the header's columns over the rows' (peak allocated 2.0 MiB, right-aligned)
            self.assertEqual(lines[1].index("peak allocated") + len("peak allocated"), row.index("2.0 MiB") + len("2.0 MiB"))
        note = next(l for l in lines if l.startswith("note ("))
        for i in range(3):
            self.assertIn(f"pid 1 on trainer-7f9c8d-worker-{i}", note)

    def test_merge_names_runs_alike_in_rank_pid_and_host_by_their_file(self):
        # Traces converted from CPU recordings are all pid 0 on cpu-recording: two rows read the
        # same but for their figures.
        corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "traces")
        paths = [os.path.join(corpus, n) for n in ("serving.trace.gz", "lstm_train.trace.gz")]
        lines = analyze("merge", *paths).stdout.splitlines()
        rows = [l for l in lines if l.startswith("pid 0 ")]
        self.assertEqual(sorted(r.split()[2] for r in rows), ["(lstm_train.trace.gz)", "(serving.trace.gz)"], lines)
        # A run alone under its pid keeps the short name.
        path = self.write(report_doc(9, "", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        self.assertIn("\npid 9 ", analyze("merge", path, paths[0]).stdout)

    def test_diff_says_which_device_a_run_never_used(self):
        a = self.write(report_doc(1, "", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)]))
        b = self.write(report_doc(2, "", [(0, MiB, 2 * MiB, 4 * MiB), (1, 3 * MiB, 3 * MiB, 4 * MiB)],
                                  [("x()", 1, MiB)]))
        lines = analyze("diff", a, b).stdout.splitlines()
        self.assertTrue(any(l.startswith("  device 1 (not used in A): peak allocated 0 B -> 3.0 MiB") for l in lines),
                        lines)
        self.assertTrue(any(l.startswith("  device 0: ") for l in lines), lines)
        devs = {d["device"]: d for d in analyze_json("diff", b, a)["devices"]}
        self.assertEqual((devs[0]["in_a"], devs[0]["in_b"]), (True, True))
        self.assertEqual((devs[1]["in_a"], devs[1]["in_b"]), (True, False))

    def test_summary_reads_a_snapshot(self):
        path = self.write(report_doc(9, "", [(0, MiB, 2 * MiB, 4 * MiB)], [("x()", 1, MiB)], reason="snapshot"))
        out = analyze_json("summary", path)
        self.assertEqual(out["reason"], "snapshot")
        self.assertTrue(any("snapshot" in n for n in out["notes"]))
        self.assertIn("snapshot", analyze("summary", path).stdout)


if __name__ == "__main__":
    unittest.main()
