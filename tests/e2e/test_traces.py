"""End-to-end tests of GPUSHIM_TRACE and gpushim-analyze: traces recorded from the e2e programs,
replayed through every policy, exported to the formats viewers read, and plotted."""
import gzip
import io
import json
import os
import pickle
import pickletools
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from pythons import interpreters
from shimtest import BIN, NO_CUDA_PROGRAM, POLICIES, PRELOAD_FIRST, REAL_GPU, ShimTestCase, base_env, check_sanitizer_clean, program, \
    require_tool, run, scaled
from test_python_stacks import markers

MiB = 1 << 20
ANALYZE = os.path.join(BIN, "gpushim-analyze")
PLOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpushim-plot")
LEAK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "planted_leak.py")


_plot_python = None


def require_plot_python():
    """gpushim-plot draws with matplotlib, from Debian's python3-matplotlib or from any Python it
    finds with it (its #! interpreter, then $GPUSHIM_PYTHON, python3 on PATH...). On a GPU machine, whose image is
    not ours, a test that draws is reported as not run there when no such Python exists; where the
    suite is checked (scripts/setup installs it) a missing matplotlib fails the drawing test itself."""
    global _plot_python
    if not REAL_GPU:
        return
    if _plot_python is None:
        _plot_python = any(
            shutil.which(name) and subprocess.run([shutil.which(name), "-c", "import matplotlib"],
                                                  capture_output=True, timeout=60).returncode == 0
            for name in ("/usr/bin/python3", os.environ.get("GPUSHIM_PYTHON") or "python3", "python3",
                         "/usr/local/bin/python3", "python"))
    require_tool(_plot_python, "a Python with matplotlib", "install Debian's python3-matplotlib (scripts/setup)")


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
    through the chunk that holds `at`. A cut at a bare fraction of the file lands on a chunk
    boundary now and then, where the trace reads as complete but for its end record, not as cut
    short."""
    for pos, _, size in trace_chunks(data):
        if at < pos + size or pos + size >= len(data):
            return pos + size // 2
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
        # Cut anywhere, the trace still reads.
        with open(path, "rb") as f:
            data = f.read()
        cut = os.path.join(workdir, "cut.trace")
        for n in sorted({torn_inside(data, len(data) // 3), torn_inside(data, len(data) // 2), len(data) - 1,
                         len(data) - 17}):
            with open(cut, "wb") as f:
                f.write(data[:n])
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
        # Cut short, damaged, or gzip around something else: one line each, read no further.
        with open(os.path.join(workdir, "t.trace.gz"), "rb") as f:
            whole = f.read()
        cases = {"cut.gz": (whole[:len(whole) // 2], "gzip data cut short"),
                 "damaged.gz": (whole[:10] + bytes(range(256)) * 64, "damaged gzip data"),
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
        end, first_events = next((pos, size) for pos, kind, size in trace_chunks(data) if kind == 5)
        cut = trace + ".cut"
        with open(cut, "wb") as g:
            g.write(data[:end + first_events // 2])
        notes = analyze_json("summary", cut)["notes"]
        growth = [n for n in notes if "growth checkpoints" in n]
        self.assertEqual(len(growth), 1, notes)
        self.assertNotIn("older shim", growth[0])
        self.assertIn("no end record", growth[0])


class PythonFrames(ShimTestCase):
    """A trace of a Python program carries the Python frames the report shows, and every reading of
    the trace (summary, folded stacks, memory-viz) names their file and line."""
    STEPS = 6

    @classmethod
    def setUpClass(cls):
        cls.lines = markers(LEAK_PY)
        cls.run_py, cls.trace = traced([interpreters()[0][0], LEAK_PY, str(cls.STEPS)])
        cls.out = tempfile.mkdtemp(prefix="gpushim-pyframes-")

    def folded(self, source):
        """{chain of Python frames, outermost first: weight} from a folded export of `source`."""
        out = os.path.join(self.out, "stacks.folded")
        analyze("export", "--format", "folded", source, "-o", out, "--lines")
        chains = {}
        with open(out) as f:
            for line in f:
                stack, weight = line.rsplit(" ", 1)
                self.assertNotIn("<python frame", stack, "a Python frame the trace did not resolve")
                chain = tuple(fr for fr in stack.split(";") if fr.endswith(")") and "(planted_leak.py:" in fr)
                chains[chain] = chains.get(chain, 0) + int(weight)
        return chains

    def test_the_trace_has_the_reports_python_frames(self):
        self.assertRanOK(self.run_py)
        # From the report: each live site's Python frames, as the folded export writes them.
        expected = set()
        for site in self.run_py.report["sites"]:
            frames = [f for f in site["frames"] if f["kind"] == "python"]
            self.assertTrue(frames, site)
            expected.add(tuple(f"{f['function']} ({os.path.basename(f['file'])}:{f['line']})" for f in reversed(frames)))
        self.assertEqual(set(self.folded(self.run_py.report_path)), expected)
        # From the trace, weighed at the peak (the last step, its scratch buffer live): the same
        # chains, plus the scratch buffer's, which is no longer live at exit.
        at_peak = self.folded(self.trace)
        self.assertLessEqual(expected, set(at_peak))
        lines = self.lines
        by_line = {}  # (caller, allocating line): bytes at the peak
        for chain, weight in at_peak.items():
            by_line[chain[-2:]] = by_line.get(chain[-2:], 0) + weight
        main = f"main (planted_leak.py:{lines['step_call']})"
        self.assertEqual(by_line[(main, f"leaky_step (planted_leak.py:{lines['leak']})")], self.STEPS * MiB)
        self.assertEqual(by_line[(main, f"leaky_step (planted_leak.py:{lines['scratch']})")], 8 * MiB)
        weights = [w for chain, w in by_line.items() if chain[-1] == f"load_model (planted_leak.py:{lines['weights']})"]
        self.assertEqual(weights, [4 * 64 * MiB])

    def test_summary_of_the_trace_names_python_file_and_line(self):
        summary = analyze_json("summary", self.trace, "--frames", "64")
        self.assertTrue(summary["at_peak_sites"])
        frames = [f for part in ("top_sites", "at_peak_sites") for s in summary[part] for f in s["frames"]]
        for function, tag in (("leaky_step", "leak"), ("leaky_step", "scratch"), ("load_model", "weights"),
                              ("main", "step_call")):
            self.assertIn(f"{function} planted_leak.py:{self.lines[tag]}", frames)
        self.assertFalse([f for f in frames if f.startswith("<python frame")], frames)
        text = analyze("summary", self.trace).stdout
        self.assertIn(f"planted_leak.py:{self.lines['weights']}", text)

    def test_memory_viz_frames_have_python_file_and_line(self):
        out = os.path.join(self.out, "snap.pickle")
        analyze("export", "--format", "memory-viz", self.trace, "-o", out)
        snap = load_memory_viz(self, out)
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        leak_line = self.lines["leak"]
        leaks = [e for e in allocs if {"filename": LEAK_PY, "line": leak_line, "name": "leaky_step"} in e["frames"]]
        self.assertEqual(len(leaks), self.STEPS, [e["frames"] for e in allocs[:3]])


    def test_sites_are_named_by_the_programs_own_line(self):
        # replay's OOM site, the perfetto-json OOM instant's "site", the timeline's growth sites and
        # summary --site's function took the innermost frame outside the shim: under ctypes
        # "libffi.so.8+0x6f7a", where summary, diff and merge named the Python line.
        r, trace = traced([interpreters()[0][0], LEAK_PY, "2"], env={"GPUSHIM_LIMIT": "200MiB"})
        self.assertEqual(len(r.report["ooms"]), 1, r.stderr)
        weights = "load_model planted_leak.py:%d" % self.lines["weights"]
        dev = analyze_json("replay", trace, "--policy", "caching")["policies"][0]["devices"][0]
        self.assertEqual(dev["oom_site"], weights)
        out = os.path.join(self.out, "oom.json")
        analyze("export", "--format", "perfetto-json", trace, "-o", out)
        with open(out) as f:
            ooms = [e for e in json.load(f)["traceEvents"] if e["name"].startswith("OOM")]
        self.assertEqual([e["args"]["site"] for e in ooms], [weights])
        self.assertEqual(analyze("summary", "--site", "1", self.trace).stdout.splitlines()[1],
                         "  load_model planted_leak.py")
        _, marked = traced([interpreters()[0][0], LEAK_PY, "20", "marks"])
        analyze("export", "--format", "timeline", marked, "-o", out)
        with open(out) as f:
            growth = json.load(f)["growth"]
        self.assertEqual([g["site"] for g in growth], ["leaky_step planted_leak.py:%d" % self.lines["leak"]])


class ReplayUnderALimit(ShimTestCase):
    def test_a_long_site_name_keeps_each_row_on_its_line(self):
        # A row was formatted into 512 bytes: an OOM site past that (a C++ template, a long Python
        # name) cut the row and its newline, and every policy's row ran into one line.
        workdir = tempfile.mkdtemp(prefix="gpushim-long-")
        script = os.path.join(workdir, "long_name.py")
        name = "allocate_" + "x" * 600
        with open(script, "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {os.path.dirname(LEAK_PY)!r})\n"
                    "import ctypes\nfrom cuda_ctypes import MiB, cuda\n"
                    f"def {name}():\n    p = ctypes.c_void_p()\n    return cuda.cudaMalloc(ctypes.byref(p), 64 * MiB)\n"
                    f"print([{name}() for _ in range(4)])\n")
        r, trace = traced([interpreters()[0][0], script], env={"GPUSHIM_LIMIT": "150MiB"})
        self.assertEqual(len(r.report["ooms"]), 2, r.stderr)
        lines = analyze("replay", trace, "--policy", "caching", "--policy", "vmm").stdout.splitlines()
        rows = [l for l in lines if l.startswith(("caching ", "vmm "))]
        self.assertEqual(len(rows), 2, lines)
        for row in rows:
            self.assertIn("yes: event ", row)
            self.assertTrue(row.endswith(f"({name} long_name.py:7); 2 refused in all"), row[-100:])

    def test_oom_is_reported_at_the_right_event(self):
        # Ten 64 MiB blocks, then ten frees: under a 200 MiB cap the 4th allocation is refused.
        r, path = traced([program("e2e_cap_and_oom"), "64", "10"], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        for policy in POLICIES:
            with self.subTest(policy=policy):
                out = analyze_json("replay", path, "--policy", policy, "--limit", "200MiB")
                dev = out["policies"][0]["devices"][0]
                self.assertTrue(dev["oom"])
                self.assertEqual(dev["oom_event"], 4)
                self.assertEqual(dev["oom_requested"], 64 * MiB)
                self.assertEqual(dev["oom_allocated"], 3 * 64 * MiB)
                self.assertEqual(dev["ooms"], 7)  # the 4th to 10th
                self.assertIn("cap_and_oom.cpp", dev["oom_site"])
                self.assertFalse(analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")["policies"][0]["devices"][0]["oom"])
        text = analyze("replay", path, "--limit", "200MiB").stdout
        self.assertIn("yes: event 4", text)

    def test_replay_as_recorded_gives_the_same_refusals_and_peak(self):
        # A library's driver-API memory shares the cap with the program's cudaMalloc: the replay
        # under the recorded policy and cap must refuse exactly what the run was refused.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_cap_and_oom"), "64", "10", "100"],
                                 env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "300MiB"})
                self.assertRanOK(r)
                self.assertEqual(len(r.report["ooms"]), 1)
                out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                dev = out["policies"][0]["devices"][0]
                self.assertEqual((dev["recorded_ooms"], dev["ooms"], dev["recorded_ooms_avoided"]), (1, 1, 0), dev)
                self.assertEqual(dev["first_difference_event"], 0)
                self.assertTrue(dev["reproduces_recorded_peak"], dev)
                self.assertFalse([n for n in out["notes"] if "departs" in n], out["notes"])

    def test_a_recorded_oom_replays_where_it_happened(self):
        # Recorded under passthrough (pooled recordings: test_a_pooled_oom_replays_where_it_happened).
        r, path = traced([program("e2e_train_loop"), "100", "--leak-mib", "6"],
                         env={"GPUSHIM_LIMIT": "400MiB", "GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        self.assertGreaterEqual(json.loads(r.stdout.splitlines()[0])["oom_at"], 0)
        summary = analyze_json("summary", path)
        self.assertEqual(len(summary["ooms"]), 1)
        self.assertEqual(summary["ooms"][0]["requested"], r.report["ooms"][0]["requested"])
        replayed = analyze_json("replay", path, "--policy", "passthrough")["policies"][0]["devices"][0]
        self.assertTrue(replayed["oom"])
        self.assertEqual(replayed["recorded_ooms"], 1)
        self.assertEqual(replayed["recorded_ooms_avoided"], 0)
        self.assertEqual(replayed["oom_requested"], r.report["ooms"][0]["requested"])
        # Growth is the exit report's own verdict (report/growth_verdict.h), replayed from the
        # trace: the program frees its leak once the OOM ends the loop, so at exit nothing grew.
        self.assertEqual((summary["growth_verdict"], summary["growth_evidence"]),
                         (r.report["growth"]["verdict"], r.report["growth"]["evidence"]))
        self.assertEqual(len(summary["growth"]), len(r.report["growth"]["suspects"]))
        self.assertFalse(any("load_model" in g["frames"][0] for g in summary["growth"]))
        # With a larger cap the refused request would have fit.
        bigger = analyze_json("replay", path, "--policy", "passthrough", "--limit", "2GiB")["policies"][0]["devices"][0]
        self.assertFalse(bigger["oom"])
        self.assertEqual(bigger["recorded_ooms_avoided"], 1)

    def test_a_pooled_oom_replays_where_it_happened(self):
        # Under a pool the refusal depends on where freed blocks were placed, which depends on when
        # the device finished with them: the trace records when the pool saw each fence complete,
        # and the replay under the recorded policy and cap follows it to the same refusal.
        for policy in [p for p in POLICIES if p != "passthrough"]:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_train_loop"), "100", "--leak-mib", "6"],
                                 env={"GPUSHIM_LIMIT": "400MiB", "GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                self.assertEqual(len(r.report["ooms"]), 1)
                out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                dev = out["policies"][0]["devices"][0]
                self.assertTrue(dev["follows_recorded_reuse"], dev)
                self.assertEqual((dev["recorded_ooms"], dev["ooms"], dev["recorded_ooms_avoided"]), (1, 1, 0), dev)
                self.assertEqual(dev["first_difference_event"], 0)
                self.assertEqual(dev["oom_requested"], r.report["ooms"][0]["requested"])
                self.assertTrue(dev["reproduces_recorded_peak"], dev)

    def test_a_driver_that_hands_memory_out_downwards_replays_exactly(self):
        # A pool breaks ties between equal free blocks by address, and a GPU's driver need not hand
        # memory out at rising addresses as the replay's simulated device does (an H200 hands a
        # caching pool's large segments out downwards): the replay puts each segment where the
        # trace says the run's driver put it, and so follows the run to the same refusal.
        for policy in [p for p in POLICIES if p != "passthrough"]:
            with self.subTest(policy=policy):
                r, path = traced([program("e2e_train_loop"), "100", "--leak-mib", "6"],
                                 env={"GPUSHIM_LIMIT": "400MiB", "GPUSHIM_POLICY": policy,
                                      "FAKECUDA_ALLOC_ORDER": "down", "FAKECUDA_KERNEL_US": "200"})
                self.assertRanOK(r)
                self.assertEqual(len(r.report["ooms"]), 1)
                out = analyze_json("replay", path, "--policy", policy, "--gpu-time", "recorded")
                dev = out["policies"][0]["devices"][0]
                self.assertEqual(dev["first_difference_event"], 0, out["notes"])
                self.assertEqual((dev["recorded_ooms"], dev["ooms"], dev["recorded_ooms_avoided"]), (1, 1, 0), dev)
                self.assertTrue(dev["reproduces_recorded_peak"], dev)
                self.assertFalse([n for n in out["notes"] if "departs" in n], out["notes"])


class Exports(ShimTestCase):
    @classmethod
    def setUpClass(cls):
        cls.run_caching, cls.trace_caching = traced([program("e2e_train_loop"), "8"], env={"GPUSHIM_POLICY": "caching"})
        cls.run_pass, cls.trace_pass = traced([program("e2e_leak_two_sites")], env={"GPUSHIM_POLICY": "passthrough"})
        cls.out = tempfile.mkdtemp(prefix="gpushim-export-")

    def test_memory_viz_from_traces_keeps_the_viewers_invariants(self):
        for trace in (self.trace_caching, self.trace_pass):
            with self.subTest(trace=trace):
                out = os.path.join(self.out, "snap.pickle")
                analyze("export", "--format", "memory-viz", trace, "-o", out)
                snap = load_memory_viz(self, out)
                check_memory_viz(self, snap)
                allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
                frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
                summary = analyze_json("summary", trace)["devices"][0]
                self.assertEqual(len(allocs), summary["total_allocs"])
                self.assertEqual(len(frees), summary["total_frees"])
                live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
                self.assertEqual(live, summary["live_bytes"])
                self.assertTrue(any(f["name"].startswith(("leak_from", "(anonymous namespace)::leaky_step"))
                                    for e in allocs for f in e["frames"]))
                # Every segment carries the stack of the allocation that made the pool take it, as
                # PyTorch's do (memory_viz: not "allocated before _record_history was enabled").
                segs = [e for e in snap["device_traces"][0] if e["action"] in ("segment_alloc", "segment_map")]
                self.assertTrue(segs)
                self.assertEqual([e for e in segs if not e["frames"]], [])

    def test_memory_viz_lays_out_the_memory_handles_key(self):
        # CUDA arrays are recorded under their handles' keys, which lie bytes apart: laid out there,
        # each array overlapped the one before, which the export took for a lost free (four
        # "inconsistencies", two "frees of unknown blocks", the live arrays missing).
        for policy in ("passthrough", "caching"):
            with self.subTest(policy=policy):
                _, trace = traced([program("e2e_cuda_arrays")], env={"GPUSHIM_POLICY": policy})
                out = os.path.join(self.out, "arrays.pickle")
                p = analyze("export", "--format", "memory-viz", trace, "-o", out)
                self.assertNotIn("note:", p.stderr)
                snap = load_memory_viz(self, out)
                check_memory_viz(self, snap)
                summary = analyze_json("summary", trace)["devices"][0]
                events = snap["device_traces"][0]
                self.assertEqual(len([e for e in events if e["action"] == "alloc"]), summary["total_allocs"])
                self.assertEqual(len([e for e in events if e["action"] == "free_completed"]), summary["total_frees"])
                live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
                self.assertEqual(len(live), 3)
                self.assertEqual(sum(b["size"] for b in live), summary["live_bytes"])
                # Below 2^53: the viewer's JavaScript holds every address exactly.
                self.assertLess(max(e["addr"] + e["size"] for e in events), 1 << 53)

    def test_memory_viz_from_a_report_has_one_block_per_live_site(self):
        out = os.path.join(self.out, "report.pickle")
        analyze("export", "--format", "memory-viz", self.run_pass.report_path, "-o", out)
        snap = load_memory_viz(self, out)
        check_memory_viz(self, snap, expect_history=False)
        self.assertEqual(snap["device_traces"], [[]])
        sizes = sorted(b["size"] for s in snap["segments"] for b in s["blocks"])
        self.assertEqual(sizes, sorted(s["live_bytes"] for s in self.run_pass.report["sites"]))

    def test_folded_stacks_parse_and_add_up(self):
        out = os.path.join(self.out, "stacks.folded")
        analyze("export", "--format", "folded", self.run_pass.report_path, "-o", out)
        with open(out) as f:
            lines = f.read().splitlines()
        total = 0
        for line in lines:
            m = re.fullmatch(r"(.+) (\d+)", line)
            self.assertIsNotNone(m, line)
            frames = m.group(1).split(";")
            self.assertTrue(all(frames), line)
            self.assertNotIn("cudaMalloc", m.group(1))  # the shim's own frames are left out
            total += int(m.group(2))
        self.assertEqual(total, sum(s["live_bytes"] for s in self.run_pass.report["sites"]))
        self.assertTrue(lines[0].startswith("_start;"), lines[0])  # outermost first
        # From a trace, weighed at the peak: the temporary 64 MiB buffer dominates.
        analyze("export", "--format", "folded", self.trace_pass, "-o", out)
        with open(out) as f:
            weights = {l.rsplit(" ", 1)[0].split(";")[-1].split(" (")[0]: int(l.rsplit(" ", 1)[1]) for l in f}
        self.assertEqual(weights["temporary_work()"], 64 * MiB)

    def test_perfetto_json_has_counter_tracks_that_reach_the_peak(self):
        out = os.path.join(self.out, "trace.json")
        analyze("export", "--format", "perfetto-json", self.trace_caching, "-o", out)
        with open(out) as f:
            doc = json.load(f)
        counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
        # Two counters of one value each: Chrome's viewer stacks the values of one counter.
        by_name = {}
        for e in counters:
            what = e["name"].rsplit(" ", 1)[1]
            self.assertEqual(set(e["args"]), {what}, e)
            by_name.setdefault(e["name"], []).append((e["ts"], e["args"][what]))
        self.assertEqual(set(by_name), {"device 0 allocated", "device 0 reserved"})
        allocated, reserved = by_name["device 0 allocated"], by_name["device 0 reserved"]
        self.assertEqual([t for t, _ in allocated], [t for t, _ in reserved])
        for (t, a), (_, r) in zip(allocated, reserved):
            self.assertLessEqual(a, r, t)
        ts = [t for t, _ in allocated]
        self.assertTrue(ts)
        self.assertEqual(ts, sorted(ts))
        summary = analyze_json("summary", self.trace_caching)["devices"][0]
        self.assertEqual(max(v for _, v in allocated), summary["peak_allocated"])
        self.assertEqual(max(v for _, v in reserved), summary["peak_reserved"])
        self.assertTrue(any(e["ph"] == "M" and e["name"] == "process_name" for e in doc["traceEvents"]))
        # A report's sampled timeline exports too.
        analyze("export", "--format", "perfetto-json", self.run_caching.report_path, "-o", out)
        with open(out) as f:
            self.assertIn("traceEvents", json.load(f))

    def test_a_few_points_asked_gives_a_few_points_with_the_peak(self):
        # --max-points 1 to 3 gave every point (thinning began at 4), not about as many as asked.
        peak = analyze_json("summary", self.trace_caching)["devices"][0]["peak_allocated"]
        out = os.path.join(self.out, "few.json")
        everything = None
        for n in ("0", "1", "2", "3", "4"):
            with self.subTest(max_points=n):
                analyze("export", "--format", "timeline", "--max-points", n, self.trace_caching, "-o", out)
                with open(out) as f:
                    samples = json.load(f)["devices"][0]["samples"]
                if n == "0":
                    everything = len(samples)
                    self.assertGreater(everything, 20)
                    continue
                self.assertLessEqual(len(samples), 5)
                self.assertEqual(max(s[1] for s in samples), peak)

    def test_plot_draws_reports_and_traces(self):
        require_plot_python()
        for source in (self.trace_caching, self.run_caching.report_path):
            with self.subTest(source=source):
                png = os.path.join(self.out, "plot.png")
                if os.path.exists(png):
                    os.unlink(png)
                proc = subprocess.run([PLOT, source, "-o", png], capture_output=True, text=True, timeout=120,
                                      env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
                self.assertEqual(proc.returncode, 0, proc.stderr)
                with open(png, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
                self.assertGreater(os.path.getsize(png), 10000)
        proc = subprocess.run([PLOT, ANALYZE, "-o", os.path.join(self.out, "x.png")], capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(proc.returncode, 1)
        self.assertTrue(proc.stderr.startswith("gpushim-plot: "), proc.stderr)

    def test_every_subcommand_has_help(self):
        for cmd in ("summary", "replay", "diff", "merge", "export"):
            p = analyze(cmd, "--help")
            self.assertIn(f"usage: gpushim-analyze {cmd}", p.stdout)
        self.assertIn("commands:", analyze("--help").stdout)
        self.assertEqual(analyze("frobnicate", check=False).returncode, 2)
        self.assertEqual(analyze("replay", "--bogus", check=False).returncode, 2)


if __name__ == "__main__":
    unittest.main()
