"""End-to-end tests of GPUSHIM_TRACE: traces recorded from the e2e programs, by many threads, cut
short, piped, compressed, and replayed through every policy to what the run did. What the analysis
makes of traces (Python frames, limits, exports) is test_trace_analysis.py. The helpers here are
shared by the modules that read traces."""
import gzip
import io
import json
import os
import pickle
import pickletools
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import zlib

from shimtest import BIN, NO_CUDA_PROGRAM, POLICIES, PRELOAD_FIRST, REAL_GPU, ShimTestCase, base_env, check_sanitizer_clean, program, \
    require_tool, run, scaled

MiB = 1 << 20
ANALYZE = os.path.join(BIN, "gpushim-analyze")
PLOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpushim-plot")
LEAK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "planted_leak.py")


_plot_python = None


def require_plot_python():
    """gpushim-plot draws with matplotlib, from Debian's python3-matplotlib or from any Python it
    finds with it (its #! interpreter, then $GPUSHIM_PYTHON, python3 on PATH...). On a GPU machine, whose image is
    not ours, a test that draws is reported as not run there when no such Python exists; where the
    suite is checked (scripts/setup installs it) a missing matplotlib fails the drawing test itself.
    Returns the first Python with matplotlib (Debian's where the suite is checked)."""
    global _plot_python
    if not REAL_GPU:
        return "/usr/bin/python3"
    if _plot_python is None:
        found = [shutil.which(name) for name in ("/usr/bin/python3", os.environ.get("GPUSHIM_PYTHON") or "python3",
                                                 "python3", "/usr/local/bin/python3", "python")]
        _plot_python = next((p for p in found if p and subprocess.run([p, "-c", "import matplotlib"],
                                                                      capture_output=True, timeout=60).returncode == 0), "")
    require_tool(bool(_plot_python), "a Python with matplotlib", "install Debian's python3-matplotlib (scripts/setup)")
    return _plot_python


def analyze(*args, check=True):
    proc = subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=120)
    check_sanitizer_clean(proc.stderr, "gpushim-analyze")
    if check and proc.returncode != 0:
        raise AssertionError(f"gpushim-analyze {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def trace_chunks(data):
    """(offset, type, size with header) of each chunk of trace bytes `data`: an 8-byte magic, then
    chunks of a 16-byte header (type at byte 4, payload length at bytes 8-11) and a payload."""
    pos = 8
    while pos + 16 <= len(data):
        size = 16 + int.from_bytes(data[pos + 8:pos + 12], "little")
        yield pos, data[pos + 4], size
        pos += size


def torn_inside(data, at):
    """Where to cut trace bytes `data` near offset `at` so that the last chunk is torn: half-way
    through the chunk that holds `at`, or, where that leaves no events chunk whole, through the
    chunk after the first events chunk (a trace with neither events nor an end record holds
    nothing to read, and every command refuses it). A cut at a bare fraction of the file lands on
    a chunk boundary now and then, where the trace reads as complete but for its end record, not
    as cut short."""
    seen_events = False
    for pos, kind, size in trace_chunks(data):
        if seen_events and (at < pos + size or pos + size >= len(data)):
            return pos + size // 2
        seen_events = seen_events or kind == 5
    return len(data) - 1


def analyze_json(*args):
    return json.loads(analyze(*args, "--json").stdout)


def traced(args, env=None, **kw):
    """Runs a program under the shim with a trace; returns (Run, trace path)."""
    workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
    path = os.path.join(workdir, "run.trace")
    extra = {"GPUSHIM_TRACE": path, "GPUSHIM_SUMMARY": "0"}
    extra.update(env or {})
    r = run(args, env=extra, workdir=workdir, **kw)
    return r, path


class SafeUnpickler(pickle.Unpickler):
    """Loads the memory-viz pickle without letting it name any class or function."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the pickle asked for {module}.{name}")


# The opcodes PyTorch's memory_viz.js unpickler implements.
VIEWER_OPCODES = {"PROTO", "FRAME", "STOP", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "MARK", "SETITEM", "SETITEMS",
                  "APPEND", "APPENDS", "DICT", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BININT", "BININT1",
                  "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE", "NEWTRUE", "NEWFALSE",
                  "MEMOIZE", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT"}


def load_memory_viz(testcase, path):
    with open(path, "rb") as f:
        data = f.read()
    used = {op.name for op, _, _ in pickletools.genops(data)}
    testcase.assertLessEqual(used, VIEWER_OPCODES, "opcodes the viewer cannot read")
    return SafeUnpickler(io.BytesIO(data)).load()


def check_memory_viz(testcase, snap, expect_history=True):
    """The structural invariants the viewer relies on: blocks tile their segments exactly, every live
    block's alloc is in the trace, and walking device_traces backwards from the segments (as the
    viewer does) never meets an inconsistency."""
    testcase.assertEqual(set(snap), {"segments", "device_traces"})
    segs_by_dev = {}
    for seg in snap["segments"]:
        at = seg["address"]
        for b in seg["blocks"]:
            testcase.assertEqual(b["address"], at, "blocks must tile the segment with no gap or overlap")
            testcase.assertIn(b["state"], ("active_allocated", "active_pending_free", "inactive"))
            testcase.assertGreater(b["size"], 0)
            testcase.assertLessEqual(b["requested_size"], b["size"])
            for f in b["frames"]:
                testcase.assertEqual(set(f), {"filename", "line", "name"})
            at += b["size"]
        testcase.assertEqual(at, seg["address"] + seg["total_size"], "blocks must cover the whole segment")
        testcase.assertEqual(seg["allocated_size"], sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive"))
        segs_by_dev.setdefault(seg["device"], []).append(seg)
    for dev, trace in enumerate(snap["device_traces"]):
        for e in trace:
            testcase.assertIn(e["action"], ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                                            "segment_map", "segment_unmap", "oom", "snapshot"))
        segments = {s["address"]: s["total_size"] for s in segs_by_dev.get(dev, [])}
        blocks = {b["address"]: b["size"] for s in segs_by_dev.get(dev, []) for b in s["blocks"]
                  if b["state"] == "active_allocated"}
        if expect_history:
            allocated_last = {}
            for e in trace:
                if e["action"] == "alloc":
                    allocated_last[e["addr"]] = True
                elif e["action"] == "free_completed":
                    allocated_last[e["addr"]] = False
            for addr in blocks:
                testcase.assertTrue(allocated_last.get(addr), f"live block {addr:#x} has no alloc event")

        def inside(addr, size):
            return any(s <= addr and addr + size <= s + n for s, n in segments.items())

        for b, size in blocks.items():
            testcase.assertTrue(inside(b, size))
        for e in reversed(trace):  # the viewer's walk
            a = e["action"]
            if a == "alloc":
                testcase.assertIn(e["addr"], blocks, "alloc of a block that is not there")
                del blocks[e["addr"]]
            elif a == "free_completed":
                testcase.assertNotIn(e["addr"], blocks)
                blocks[e["addr"]] = e["size"]
                testcase.assertTrue(inside(e["addr"], e["size"]), "freed block outside every segment")
            elif a == "segment_free":
                testcase.assertNotIn(e["addr"], segments)
                segments[e["addr"]] = e["size"]
            elif a == "segment_alloc":
                testcase.assertIn(e["addr"], segments)
                testcase.assertFalse(any(e["addr"] <= b < e["addr"] + e["size"] for b in blocks),
                                     "segment allocated under live blocks")
                del segments[e["addr"]]
        if expect_history:
            testcase.assertEqual(blocks, {}, "the walk back must end with nothing allocated")
            testcase.assertEqual(segments, {}, "the walk back must end with no segment")


class Recording(ShimTestCase):
    def test_replay_reproduces_the_recorded_peak_exactly(self):
        programs = [["e2e_leak_two_sites"], ["e2e_free_everything"], ["e2e_train_loop", "15"],
                    ["e2e_cap_and_oom", "64", "8"], ["e2e_graph_capture"], ["e2e_invalid_frees"]]
        for policy in POLICIES:
            for args in programs:
                with self.subTest(policy=policy, program=args[0]):
                    r, path = traced([program(args[0])] + args[1:], env={"GPUSHIM_POLICY": policy})
                    self.assertRanOK(r)
                    out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                    self.assertEqual(out["recorded_policy"], policy)
                    for dev in out["policies"][0]["devices"]:
                        report_dev = r.device(dev["device"])
                        # Single-threaded programs: the shim's counters, the trace and the replay agree.
                        self.assertEqual(dev["peak_allocated"], report_dev["peak_allocated_bytes"])
                        self.assertTrue(dev["reproduces_recorded_peak"])
                        self.assertEqual(dev["shim_peak_allocated"], report_dev["peak_allocated_bytes"])
                        self.assertEqual(dev["allocs"], report_dev["total_allocs"])
                        # Every block the size the run handed out: the replay followed the device's
                        # timing as the trace recorded it (kReuse events), not a simulated one.
                        self.assertEqual(dev["first_difference_event"], 0, out["notes"])
                        if policy != "passthrough" and args[0] == "e2e_train_loop":
                            self.assertTrue(dev["follows_recorded_reuse"], dev)
                    self.assertFalse([n for n in out["notes"] if "under the recorded policy" in n], out["notes"])

    def test_every_path_to_device_memory_reaches_the_trace(self):
        # Runtime, driver API, pitched, stream-ordered and virtual-memory allocations, some left
        # live: the trace holds exactly the events the report counts, and replays to its peak.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_trace_every_path")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                report_dev = r.device(0)
                dev = analyze_json("summary", path)["devices"][0]
                self.assertEqual(report_dev["total_allocs"], 11)
                for key in ("total_allocs", "total_frees", "live_count", "live_bytes"):
                    self.assertEqual(dev[key], report_dev[key], key)
                self.assertEqual(dev["peak_allocated"], report_dev["peak_allocated_bytes"])
                replay = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")["policies"][0]["devices"][0]
                self.assertTrue(replay["reproduces_recorded_peak"], replay)

    def test_concurrent_threads_replay_the_pools_own_order(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_threads_alloc"), "8", "1000"], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                held = json.loads(r.stdout.strip().splitlines()[-1])
                summary = analyze_json("summary", path)
                dev = summary["devices"][0]
                self.assertEqual(dev["total_allocs"], held["allocs"])
                self.assertEqual(dev["total_frees"], held["frees"])
                self.assertEqual(dev["live_count"], held["live_count"])
                self.assertEqual(dev["live_bytes"], r.device(0)["live_bytes"])
                replay = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")["policies"][0]["devices"][0]
                # The replay hands out exactly the sizes the pool handed out, in the pool's order.
                self.assertTrue(replay["reproduces_recorded_peak"], replay)
                self.assertEqual(replay["peak_allocated"], dev["peak_allocated"])

    def test_threads_ending_streams_replay_as_they_ran(self):
        # Threads free blocks stream-ordered on streams they then destroy, while others allocate:
        # the pool forgets each such stream (recording its blocks' event, which takes an event
        # number) at the destroy, between other threads' operations. The trace says where, and the
        # replay under the recorded policy forgets it there too, so every later block is the run's.
        # (vmm: and it reserves each address range where the run's driver put it, which the
        # simulated driver's mmap places in no fixed order among the threads' own mappings.)
        for policy in [p for p in POLICIES if p != "passthrough"]:
            for seed in ("5", "6"):
                with self.subTest(policy=policy, seed=seed):
                    r, path = traced([program("e2e_reuse_integrity"), "4", str(scaled(100, 40)), seed],
                                     env={"GPUSHIM_POLICY": policy, "FAKECUDA_KERNEL_US": "200",
                                          "FAKECUDA_ALLOC_ORDER": "down"})
                    self.assertRanOK(r)
                    out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                    dev = out["policies"][0]["devices"][0]
                    self.assertTrue(dev["follows_recorded_reuse"], dev)
                    self.assertEqual(dev["first_difference_event"], 0, out["notes"])
                    self.assertTrue(dev["reproduces_recorded_peak"], dev)
                    self.assertFalse([n for n in out["notes"] if "under the recorded policy" in n], out["notes"])
                    # The trace names the vmm pool that ran (GPUSHIM_VMM_REUSE, unset here).
                    self.assertFalse([n for n in out["notes"] if "GPUSHIM_VMM_REUSE" in n], out["notes"])

    def test_trace_names_the_same_sites_and_lines_as_the_report(self):
        r, path = traced([program("e2e_leak_two_sites")])
        self.assertRanOK(r)
        summary = analyze_json("summary", path, "--frames", "1")
        live = {s["frames"][0]: s["live_bytes"] for s in summary["top_sites"]}
        for site in r.report["sites"]:
            frame = next(f for f in site["frames"] if "leak_from" in f["function"])
            key = next(k for k in live if k.startswith(frame["function"]))
            self.assertIn(f"leak_two_sites.cpp:{frame['line']}", key)
            self.assertEqual(live[key], site["live_bytes"])

    def test_a_process_that_never_uses_cuda_writes_no_trace(self):
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        r = run([NO_CUDA_PROGRAM], env={"GPUSHIM_TRACE": os.path.join(workdir, "t.trace")}, expect_report=False,
                workdir=workdir)
        self.assertRanOK(r)
        self.assertEqual(os.listdir(workdir), [])
        self.assertEqual(r.stderr, "")

    def test_default_name_and_never_overwrite(self):
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        for _ in range(2):
            r = run([program("e2e_free_everything")], env={"GPUSHIM_TRACE": "on", "GPUSHIM_SUMMARY": "0"},
                    workdir=workdir)
            self.assertRanOK(r)
        traces = sorted(f for f in os.listdir(workdir) if f.endswith(".trace"))
        self.assertEqual(len(traces), 2, traces)
        for t in traces:
            self.assertRegex(t, r"^gpushim\.e2e_free_everything\.\d+\.trace$")

    def test_trace_is_compact(self):
        r, path = traced([program("e2e_threads_alloc"), "4", "3000"], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        dev = analyze_json("summary", path)["devices"][0]
        events = dev["total_allocs"] + dev["total_frees"]
        self.assertGreater(events, 10000)
        # Everything included: header, module map and stacks.
        self.assertLess(os.path.getsize(path) / events, 16.0)

    def test_kill_9_leaves_a_trace_readable_up_to_its_last_complete_chunk(self):
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        path = os.path.join(workdir, "killed.trace")
        env = base_env({"GPUSHIM_TRACE": path, "GPUSHIM_REPORT": os.path.join(workdir, "r.json")})
        proc = subprocess.Popen([program("e2e_train_loop"), "10", "--hang"], env=env, cwd=workdir,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()
            self.assertIn("iterations", first)
            self.assertEqual(proc.stdout.readline().strip(), "ready")
            # The writer flushes every 50 to 250 ms (it waits longer after passes that found
            # nothing): kill once the trace holds every allocation, not after a fixed sleep, which
            # a busy machine can outlast.
            deadline = time.monotonic() + 60
            written = 0
            while written < 8 + 10 * 8 and time.monotonic() < deadline:
                time.sleep(0.05)
                p = analyze("summary", path, "--json", check=False)
                devices = json.loads(p.stdout)["devices"] if p.returncode == 0 and p.stdout else []
                written = devices[0]["total_allocs"] if devices else 0
        finally:
            proc.send_signal(signal.SIGKILL)
            _, stderr = proc.communicate(timeout=30)
        check_sanitizer_clean(stderr, "e2e_train_loop")
        summary = analyze_json("summary", path)
        self.assertEqual(summary["reason"], "truncated")
        self.assertTrue(any("end record" in n or "cut short" in n for n in summary["notes"]), summary["notes"])
        dev = summary["devices"][0]
        self.assertEqual(dev["total_allocs"], 8 + 10 * 8)  # weights, then 6 + scratch + leak per iteration
        self.assertEqual(dev["live_bytes"], 8 * 16 * MiB + 10 * MiB)
        # Cut anywhere, the trace still reads, once it holds an events chunk whole (before, it holds
        # nothing to read, and is refused in one line).
        with open(path, "rb") as f:
            data = f.read()
        cut = os.path.join(workdir, "cut.trace")
        for n in sorted({torn_inside(data, len(data) // 3), torn_inside(data, len(data) // 2), len(data) - 1,
                         len(data) - 17}):
            with open(cut, "wb") as f:
                f.write(data[:n])
            if not any(kind == 5 and pos + size <= n for pos, kind, size in trace_chunks(data)):
                p = analyze("summary", cut, check=False)
                self.assertEqual((p.returncode, p.stdout), (1, ""), p.stderr)
                self.assertIn(f"{cut}: no events to read: the trace is cut short", p.stderr)
                continue
            out = analyze_json("summary", cut)
            self.assertLessEqual(out["devices"][0]["total_allocs"], dev["total_allocs"])
            self.assertTrue(any("cut short" in note for note in out["notes"]), out["notes"])

    def test_gzip_compressed_reports_and_traces_read_as_they_are(self):
        # bench/traces ships traces as .trace.gz, and people keep what they record compressed.
        r, trace = traced([program("e2e_leak_two_sites")])
        self.assertRanOK(r)
        workdir = tempfile.mkdtemp(prefix="gpushim-gzip-")
        for name, src in (("t.trace.gz", trace), ("r.json.gz", r.report_path)):
            with self.subTest(input=name):
                with open(src, "rb") as f:
                    data = f.read()
                packed = os.path.join(workdir, name)
                with gzip.open(packed, "wb") as f:
                    f.write(data)
                self.assertEqual(analyze_json("summary", packed)["devices"], analyze_json("summary", src)["devices"])
                # A member after the first (`cat a.gz b.gz`) is read too; padding after the last is not data.
                with open(packed, "ab") as f:
                    f.write(b"\0" * 16)
                self.assertEqual(analyze_json("summary", packed)["devices"], analyze_json("summary", src)["devices"])
        with open(os.path.join(workdir, "t.trace.gz"), "rb") as f:
            whole = f.read()
        # Cut short (a copy that stopped): read up to the tear, as the same bytes uncompressed are
        # (a torn tail, docs/trace-format.md), and said so.
        # Cut where what it decompresses to holds an events chunk whole: a trace with no events and
        # no end record is refused (test_a_trace_with_no_events_is_refused_alike_by_every_command).
        def holds_events(cut):
            plain = zlib.decompressobj(wbits=31).decompress(cut)
            return any(kind == 5 and pos + size <= len(plain) for pos, kind, size in trace_chunks(plain))
        cut = next(whole[:n] for n in range(len(whole) // 2, len(whole)) if holds_events(whole[:n]))
        torn = os.path.join(workdir, "cut.trace.gz")
        with open(torn, "wb") as f:
            f.write(cut)
        raw = os.path.join(workdir, "cut.trace")
        with open(raw, "wb") as f:
            f.write(zlib.decompressobj(wbits=31).decompress(cut))
        p = analyze("summary", torn)
        self.assertIn(f"{torn}: the gzip data is cut short: read up to the tear", p.stdout + p.stderr)
        self.assertEqual(analyze_json("summary", torn)["devices"], analyze_json("summary", raw)["devices"])
        # Damaged, or gzip around something else: one line each, read no further.
        cases = {"damaged.gz": (whole[:10] + bytes(range(256)) * 64, "damaged gzip data"),
                 "other.gz": (gzip.compress(bytes(range(256)) * 1024), "neither a gpushim report (JSON) nor a gpushim trace")}
        for name, (data, message) in cases.items():
            with self.subTest(input=name):
                path = os.path.join(workdir, name)
                with open(path, "wb") as f:
                    f.write(data)
                p = analyze("summary", path, check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertIn(message, p.stderr)

    def test_a_trace_from_a_pipe_is_read_once(self):
        # `summary <(zcat run.trace.gz)`: a pipe gives its bytes once. summary read a trace twice
        # (once more for the allocation rankings) and said the pipe was empty.
        r, trace = traced([program("e2e_leak_two_sites")])
        self.assertRanOK(r)
        with open(trace, "rb") as f:
            data = f.read()
        for args in (["summary", "--json"], ["summary"], ["summary", "--format", "torch"]):
            with self.subTest(args=args):
                whole = analyze(*args, trace).stdout
                piped = subprocess.run([ANALYZE, *args, "/dev/stdin"], input=data, capture_output=True, timeout=120)
                check_sanitizer_clean(piped.stderr.decode(), "gpushim-analyze")
                self.assertEqual(piped.returncode, 0, piped.stderr)
                self.assertEqual(piped.stdout.decode().replace("/dev/stdin", trace), whole)

    def test_replay_of_a_report_says_it_needs_a_trace(self):
        # It said "not a gpushim trace (no GPUSHIMT magic)".
        r, _ = traced([program("e2e_leak_two_sites")])
        p = analyze("replay", r.report_path, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, f"gpushim-analyze replay: {r.report_path} is a report: replay needs a trace of the "
                                   "run's every allocation (GPUSHIM_TRACE)\n")

    def test_corrupt_inputs_get_one_clear_line(self):
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        junk = os.path.join(workdir, "junk")
        with open(junk, "wb") as f:
            f.write(b"GPUSHIMT" + os.urandom(64))
        bad_report = os.path.join(workdir, "bad.json")
        with open(bad_report, "w") as f:
            f.write('{"schema":"gpushim-report/1","devices":[{"device":"zero"}],"sites":[]}')
        for cmd in (["summary", junk], ["replay", junk], ["summary", bad_report], ["export", "--format", "folded",
                                                                                  bad_report, "-o", "-"]):
            p = analyze(*cmd, check=False)
            self.assertEqual(p.returncode, 1, cmd)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("devices[0].device: expected an integer", analyze("summary", bad_report, check=False).stderr)

    def test_an_empty_file_and_a_report_cut_short_are_said_as_such(self):
        # Both read "invalid JSON at line 1, column 1: ... unexpected end of input" (the empty
        # file) or at some line and column (the report cut while written or copied).
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        empty = os.path.join(workdir, "run.trace")
        open(empty, "wb").close()
        for cmd in (["summary", empty], ["replay", empty], ["diff", empty, empty], ["merge", empty],
                    ["export", "--format", "perfetto-json", empty, "-o", "-"]):
            with self.subTest(cmd=cmd):
                p = analyze(*cmd, check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertEqual(p.stderr, f"gpushim-analyze {cmd[0]}: {empty} is empty: no report or trace was "
                                           "written into it\n")
        r = run([program("e2e_leak_two_sites")], env={"GPUSHIM_SUMMARY": "0"}, workdir=workdir)
        with open(r.report_path, "rb") as f:
            whole = f.read()
        cut = os.path.join(workdir, "cut.json")
        with open(cut, "wb") as f:
            f.write(whole[:len(whole) // 2])
        p = analyze("summary", cut, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertTrue(p.stderr.startswith(f"gpushim-analyze summary: {cut}: the report is cut short, after "
                                            f"{len(whole) // 2} bytes (invalid JSON at line "), p.stderr)

    def test_a_trace_with_no_events_is_refused_alike_by_every_command(self):
        # `head -c 3000 run.trace`, cut before its first events chunk: replay printed an empty table,
        # summary, diff and merge a run of 0 B, export an empty file, all with exit 0. A trace cut
        # inside its header was "not a gpushim trace". Now one line naming the file, exit 1; a
        # trace cut after its first events (a crashed run's) still reads.
        r, trace = traced([program("e2e_leak_two_sites")])
        self.assertRanOK(r)
        with open(trace, "rb") as f:
            data = f.read()
        first = next(pos for pos, kind, _ in trace_chunks(data) if kind == 5)  # the first events chunk
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        cut = os.path.join(workdir, "cut.trace")
        for n, why in ((first + 20, "no events to read: the trace is cut short (torn chunk ("),
                       (first, f"no events to read: the trace ends after its header (at byte {first}), without an "
                               "end record"),
                       (40, "a gpushim trace cut short inside its header chunk (torn chunk (")):
            with open(cut, "wb") as f:
                f.write(data[:n])
            for cmd in (["summary", cut], ["replay", cut], ["diff", cut, r.report_path], ["merge", cut],
                        ["export", "--format", "folded", cut, "-o", "-"], ["export", "--format", "perfetto", cut, "-o",
                                                                           os.path.join(workdir, "out.pftrace")]):
                with self.subTest(bytes=n, cmd=cmd[0]):
                    p = analyze(*cmd, check=False)
                    self.assertEqual(p.returncode, 1, p.stderr)
                    self.assertEqual(p.stdout, "")
                    lines = p.stderr.splitlines()
                    self.assertEqual(len(lines), 1, p.stderr)
                    self.assertTrue(lines[0].startswith(f"gpushim-analyze {cmd[0]}: {cut}: {why}"), lines[0])
        # Cut before its end record: events without an end, as a crashed run leaves them, read.
        end = next(pos for pos, kind, _ in trace_chunks(data) if kind == 6)
        with open(cut, "wb") as f:
            f.write(data[:end])
        out = analyze_json("summary", cut)
        self.assertEqual(out["reason"], "truncated")
        self.assertGreater(out["devices"][0]["total_allocs"], 0)
        self.assertIn("the trace has no end record (the process did not exit cleanly)", out["notes"])
        self.assertEqual(analyze("replay", "--policy", "caching", cut).returncode, 0)

    def test_endless_or_huge_inputs_get_one_line_and_bounded_memory(self):
        # /dev/zero used to be read until std::bad_alloc aborted the tool.
        for cmd in (["summary", "/dev/zero"], ["replay", "/dev/zero"], ["merge", "/dev/zero"],
                    ["export", "--format", "folded", "/dev/zero", "-o", "-"], ["diff", "/dev/zero", "/dev/zero"]):
            with self.subTest(cmd=cmd):
                p = analyze(*cmd, check=False)
                self.assertNotEqual(p.returncode, 0, cmd)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertIn("neither a gpushim report (JSON) nor a gpushim trace", p.stderr)
        # Binary data that happens to open with '{' (/dev/urandom does, one time in 256) is refused
        # after its first block too, not read to the size cap.
        workdir = tempfile.mkdtemp(prefix="gpushim-trace-")
        for name, head in (("brace-binary", b"{" + bytes(range(256))), ("brace-number", b"{1" + b" " * 64)):
            with self.subTest(input=name):
                path = os.path.join(workdir, name)
                with open(path, "wb") as f:
                    f.write(head * 4096)
                p = analyze("summary", path, check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("neither a gpushim report (JSON) nor a gpushim trace", p.stderr)
        # Something that starts like a report but never ends stops at the size cap.
        big = os.path.join(workdir, "big.json")
        with open(big, "w") as f:
            f.write('{"schema"' + " " * (3 << 20))
        env = dict(os.environ, GPUSHIM_ANALYZE_MAX_INPUT="1MiB")
        p = subprocess.run([ANALYZE, "summary", big], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("larger than 1.0 MiB", p.stderr)
        # Compressed, the same bound applies to what it decompresses to (a 3 MB gzip of 3 GB was
        # read whole): 3 MiB of it, 4 KiB compressed, stop at the cap with one line.
        bomb = os.path.join(workdir, "big.json.gz")
        with gzip.open(bomb, "wb") as f:
            f.write(b'{"schema"' + b" " * (3 << 20))
        self.assertLess(os.path.getsize(bomb), 64 << 10)
        p = subprocess.run([ANALYZE, "summary", bomb], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("larger than 1.0 MiB", p.stderr)

    def test_a_bad_max_input_setting_is_named_once_and_the_default_used(self):
        # GPUSHIM_ANALYZE_MAX_INPUT=garbage (or -5, or empty) was dropped without a word.
        _, trace = traced([program("e2e_leak_two_sites")])
        for value in ("garbage", "-5", "", "0"):
            with self.subTest(value=value):
                env = dict(os.environ, GPUSHIM_ANALYZE_MAX_INPUT=value)
                p = subprocess.run([ANALYZE, "diff", trace, trace], capture_output=True, text=True, timeout=60, env=env)
                self.assertEqual(p.returncode, 0, p.stderr)
                warnings = [l for l in p.stderr.splitlines() if "GPUSHIM_ANALYZE_MAX_INPUT" in l]
                self.assertEqual(len(warnings), 1, p.stderr)  # two inputs read, one line
                self.assertIn("GPUSHIM_ANALYZE_MAX_INPUT='%s'" % value, warnings[0])
                self.assertIn("bytes with units", warnings[0])
                self.assertIn("using the default", warnings[0])
        env = dict(os.environ, GPUSHIM_ANALYZE_MAX_INPUT="1GiB")
        p = subprocess.run([ANALYZE, "summary", trace], capture_output=True, text=True, timeout=60, env=env)
        self.assertNotIn("GPUSHIM_ANALYZE_MAX_INPUT", p.stderr)

    def test_export_never_writes_over_its_input(self):
        # `export -o in.trace in.trace` replaced the trace with its export and exited 0.
        _, trace = traced([program("e2e_leak_two_sites")])
        with open(trace, "rb") as f:
            original = f.read()
        hard = trace + ".link"
        os.link(trace, hard)
        sym = trace + ".sym"
        os.symlink(trace, sym)
        for out in (trace, hard, sym, os.path.join(os.path.dirname(trace), ".", "run.trace")):
            with self.subTest(out=out):
                p = analyze("export", "--format", "folded", "-o", out, trace, check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertIn("is the input", p.stderr)
                with open(trace, "rb") as f:
                    self.assertEqual(f.read(), original)
        other = trace + ".folded"
        analyze("export", "--format", "folded", "-o", other, trace)
        self.assertTrue(os.path.getsize(other) > 0)

    def test_a_failed_export_leaves_the_earlier_output_whole(self):
        # `export -o` truncated its target first: a full disk left a cut file where the user's
        # earlier export had been. The disk fills 100 bytes in (the write() stand-in of test_files).
        _, trace = traced([program("e2e_leak_two_sites")])
        out_dir = os.path.realpath(tempfile.mkdtemp(prefix="gpushim-export-"))
        out = os.path.join(out_dir, "run.folded")
        with open(out, "w") as f:
            f.write("the earlier export\n")
        os.chmod(out, 0o640)
        full_disk = os.path.join(BIN, "..", "e2e-libs", "libgpushim_test_full_disk.so")
        # A sanitizer build's runtime comes first in the preload list, as for the shim.
        env = dict(os.environ, LD_PRELOAD=(PRELOAD_FIRST + ":" if PRELOAD_FIRST else "") + full_disk,
                   FULLDISK_DIR=out_dir, FULLDISK_BYTES="100")
        p = subprocess.run([ANALYZE, "export", "--format", "folded", "-o", out, trace], capture_output=True,
                           text=True, timeout=120, env=env)
        check_sanitizer_clean(p.stderr, "gpushim-analyze")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(p.stderr, f"gpushim-analyze export: cannot write {out}: No space left on device\n")
        with open(out) as f:
            self.assertEqual(f.read(), "the earlier export\n")
        self.assertEqual(os.listdir(out_dir), ["run.folded"])  # no temporary file left
        # A successful export replaces the file and keeps its mode; through a link, the link stays.
        link = os.path.join(out_dir, "latest.folded")
        os.symlink("run.folded", link)
        analyze("export", "--format", "folded", "-o", link, trace)
        self.assertTrue(os.path.islink(link))
        with open(out) as f:
            self.assertIn(";", f.read())
        self.assertEqual(os.stat(out).st_mode & 0o777, 0o640)
        self.assertEqual(sorted(os.listdir(out_dir)), ["latest.folded", "run.folded"])

    def test_a_current_trace_cut_short_is_not_blamed_on_an_older_shim(self):
        # Cut before its first events chunk (and so before any checkpoint), as a kill -9 early in
        # the run leaves it: the note blamed "an older shim".
        r, trace = traced([program("e2e_demo_training_loop")])
        with open(trace, "rb") as f:
            data = f.read()
        # Half of the first events chunk (type 5), which may be shorter than 100 bytes (a busy
        # machine's first flush can hold a single checkpoint): a torn chunk after what came before.
        # With no events and no end record it holds nothing to read: refused, as cut short.
        end, first_events = next((pos, size) for pos, kind, size in trace_chunks(data) if kind == 5)
        cut = trace + ".cut"
        with open(cut, "wb") as g:
            g.write(data[:end + first_events // 2])
        p = analyze("summary", "--json", cut, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertTrue(p.stderr.startswith(f"gpushim-analyze summary: {cut}: no events to read: the trace is cut "
                                            f"short (torn chunk ({first_events - 16} bytes announced) at byte {end})"),
                        p.stderr)
        self.assertNotIn("older shim", p.stderr)


if __name__ == "__main__":
    unittest.main()
