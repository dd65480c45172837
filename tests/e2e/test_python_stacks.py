"""End-to-end tests of Python frames in stacks: real Python scripts (every CPython 3.9-3.13 this
machine has, python3 from PATH first) allocating through ctypes under the shim. The report must
name each allocation's file, function and exact line, interleaved correctly with native frames."""
import json
import os
import re
import unittest

from pythons import interpreters
from shimtest import BIN, ShimTestCase, program, run

MiB = 1 << 20
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python")
EVERYWHERE = os.path.join(SCRIPTS, "stacks_everywhere.py")
HELPERS = os.path.join(BIN, "libe2e_native_helpers.so")
REPEATED = os.path.join(SCRIPTS, "repeated_sites.py")


def markers(path):
    """{tag: line} for every `# @tag` comment in the script."""
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            m = re.search(r"# @(\w+)\s*$", line)
            if m:
                out[m.group(1)] = n
    return out


def python_frames(site):
    return [f for f in site["frames"] if f["kind"] == "python"]


def site_by_size(report, size):
    found = [s for s in report["sites"] if s["live_count"] and s["live_bytes"] == size * s["live_count"]]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} sites allocate {size} bytes each: {json.dumps(report['sites'])[:4000]}")
    return found[0]


def index_of(frames, pred):
    for i, f in enumerate(frames):
        if pred(f):
            return i
    raise AssertionError(f"no such frame in {[(f['function'], f['kind']) for f in frames]}")


class PythonFramesInEveryStack(ShimTestCase):
    # One run per (interpreter, settings), shared by the tests that only read its report.
    _runs = {}

    def run_everywhere(self, python, env=None):
        key = (python, tuple(sorted((env or {}).items())))
        if key not in self._runs:
            extra = {"GPUSHIM_POLICY": "passthrough"}
            extra.update(env or {})
            r = run([python, EVERYWHERE, HELPERS], env=extra)
            self.assertRanOK(r)
            self._runs[key] = r
        return self._runs[key]

    def test_file_function_and_exact_line_of_every_allocation(self):
        lines = markers(EVERYWHERE)
        for python, version in interpreters():
            with self.subTest(python=python):
                r = self.run_everywhere(python)
                rep = r.report
                self.assertTrue(rep["python"].startswith(f"{version[0]}.{version[1]}."), rep["python"])
                qual = version >= (3, 11)  # co_qualname exists from 3.11

                def expect_chain(size, chain):
                    got = [(f["function"], f["line"]) for f in python_frames(site_by_size(rep, size))
                           if f["file"] == EVERYWHERE]
                    want = [(fn, lines[tag]) for fn, tag in chain]
                    self.assertEqual(got, want, f"{size // MiB} MiB")

                expect_chain(1 * MiB, [("plain", "plain_alloc"), ("caller", "caller_call"), ("<module>", "module_caller")])
                expect_chain(2 * MiB, [("Model.build" if qual else "build", "method_alloc"), ("<module>", "module_method")])
                expect_chain(3 * MiB, [("generate", "generator_alloc"), ("consume", "consume_call"),
                                       ("<module>", "module_consume")])
                expect_chain(4 * MiB, [("recurse", "recurse_alloc")] + [("recurse", "recurse_call")] * 24 +
                             [("<module>", "module_recurse")])
                expect_chain(10 * MiB, [("plain_holding_gil", "gil_alloc"), ("<module>", "module_gil")])
                # Every Python frame is marked as such and carries no native data.
                for s in rep["sites"]:
                    for f in python_frames(s):
                        self.assertEqual((f["module"], f["address"], f["module_offset"]), ("", 0, 0), f)
                        self.assertTrue(os.path.isabs(f["file"]) or f["file"].startswith("<"), f)

    def test_threads_get_their_own_frames_and_native_threads_none(self):
        lines = markers(EVERYWHERE)
        for python, version in interpreters():
            with self.subTest(python=python):
                rep = self.run_everywhere(python).report
                # A Python thread: its own function, then threading's bootstrap; never the main
                # thread's frames (which were blocked in join() at the time).
                frames = python_frames(site_by_size(rep, 5 * MiB))
                self.assertEqual((frames[0]["function"], frames[0]["file"], frames[0]["line"]),
                                 ("thread_worker", EVERYWHERE, lines["thread_alloc"]))
                self.assertTrue(all(f["file"].endswith("threading.py") for f in frames[1:]), frames)
                self.assertGreaterEqual(len(frames), 3)
                # A native thread started from C: no Python frame at all, its native function named.
                site = site_by_size(rep, 6 * MiB)
                self.assertEqual(python_frames(site), [])
                self.assertTrue(any(f["function"] == "native_thread_body" for f in site["frames"]), site["frames"])

    def test_native_frames_interleave_where_the_interpreter_ran_them(self):
        lines = markers(EVERYWHERE)
        for python, version in interpreters():
            with self.subTest(python=python):
                rep = self.run_everywhere(python).report
                for size, tag in ((7 * MiB, "native_call"), (9 * MiB, "native_gil_call")):
                    frames = site_by_size(rep, size)["frames"]
                    native = index_of(frames, lambda f: f["function"] == "native_alloc_in_c")
                    first_py = index_of(frames, lambda f: f["kind"] == "python")
                    self.assertLess(native, first_py)
                    self.assertEqual(frames[first_py]["line"], lines[tag])
                # Python -> C -> Python callback -> cudaMalloc: the C frame sits between the two.
                frames = site_by_size(rep, 8 * MiB)["frames"]
                cb = index_of(frames, lambda f: f["function"] == "python_callback")
                c = index_of(frames, lambda f: f["function"] == "native_call_back")
                outer = index_of(frames, lambda f: f["function"] == "with_callback")
                self.assertLess(cb, c)
                self.assertLess(c, outer)
                self.assertEqual(frames[cb]["line"], lines["callback_alloc"])
                self.assertEqual(frames[outer]["line"], lines["with_callback_call"])
                # The interpreter's own native frames collapse into the Python frames they ran.
                for s in rep["sites"]:
                    names = [f["function"] for f in s["frames"] if f["kind"] == "native"]
                    self.assertFalse([n for n in names if n.startswith("_PyEval_") or n in ("PyObject_Call", "Py_RunMain")],
                                     names)

    def test_summary_names_python_lines(self):
        lines = markers(EVERYWHERE)
        python = interpreters()[0][0]
        r = self.run_everywhere(python, {"GPUSHIM_SUMMARY": "20"})
        summary = "\n".join(r.shim_lines())
        self.assertIn(f"at plain (stacks_everywhere.py:{lines['plain_alloc']})", summary)
        self.assertIn(f"at caller (stacks_everywhere.py:{lines['caller_call']})", summary)
        self.assertIn(f"at python_callback (stacks_everywhere.py:{lines['callback_alloc']})", summary)
        # A site with Python frames shows them, not the ctypes/libffi plumbing above them.
        self.assertNotIn("ffi_call", summary)
        # The native thread's site keeps its native frames.
        self.assertIn("native_thread_body", summary)

    def test_python_stacks_off(self):
        python = interpreters()[0][0]
        r = self.run_everywhere(python, {"GPUSHIM_PYTHON_STACKS": "0"})
        self.assertEqual(r.report["python"], "off")
        self.assertEqual([f for s in r.report["sites"] for f in python_frames(s)], [])
        # Native capture is unchanged (the 7 and 9 MiB calls now have one stack, so one site).
        self.assertEqual(sum(s["live_bytes"] for s in r.sites_with_function("native_alloc_in_c")), 6 * MiB + 7 * MiB + 9 * MiB)

    def test_stack_capture_off_captures_no_python_either(self):
        python = interpreters()[0][0]
        r = self.run_everywhere(python, {"GPUSHIM_STACK_DEPTH": "0"})
        self.assertTrue(all(s["frames"] == [] for s in r.report["sites"]))
        self.assertEqual(r.device(0)["live_count"], 11)

    def test_fork_while_threads_allocate_never_hangs_a_child(self):
        python = interpreters()[0][0]
        script = os.path.join(SCRIPTS, "fork_while_allocating.py")
        r = run([python, script, "30"], env={"GPUSHIM_SAMPLE_MS": "1"}, timeout=120)
        self.assertRanOK(r)
        self.assertIn("forked 30", r.stdout)

    def test_native_program_reports_no_interpreter(self):
        r = run([program("e2e_leak_two_sites")])
        self.assertRanOK(r)
        self.assertEqual(r.report["python"], "")


if __name__ == "__main__":
    unittest.main()


class RepeatedSites(ShimTestCase):
    """The stack cache (interpose/stacks/stack_cache.h) serves repeated sites: a stale answer would
    put an allocation under another line, caller or depth, and its site would hold two sizes."""

    def test_each_repetition_keeps_its_own_line_caller_and_depth(self):
        lines = markers(REPEATED)
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, REPEATED], env={"GPUSHIM_POLICY": "passthrough"})
                self.assertRanOK(r)
                rounds = 12

                def chain(size, count, want):
                    site = site_by_size(r.report, size)
                    self.assertEqual(site["live_count"], count, f"{size // 1024} KiB")
                    got = [(f["function"], f["line"]) for f in python_frames(site) if f["file"] == REPEATED]
                    self.assertEqual(got, [(fn, lines[tag]) for fn, tag in want], f"{size // 1024} KiB")

                step = [("step", "step_two_lines"), ("<module>", "module_step")]
                chain(4 * 1024, rounds, [("alloc", "alloc"), ("two_lines", "line_a")] + step)
                chain(8 * 1024, rounds, [("alloc", "alloc"), ("two_lines", "line_b")] + step)
                outer = [("step", "step_outer"), ("<module>", "module_step")]
                chain(12 * 1024, rounds, [("alloc", "alloc"), ("middle", "middle_call"), ("outer_a", "outer_a_call")] + outer)
                chain(16 * 1024, rounds, [("alloc", "alloc"), ("middle", "middle_call"), ("outer_b", "outer_b_call")] + outer)
                for depth in range(4):
                    chain((20 + 4 * depth) * 1024, rounds // 4,
                          [("alloc", "alloc"), ("recurse", "recurse_alloc")] + [("recurse", "recurse_call")] * depth +
                          [("step", "step_recurse"), ("<module>", "module_step")])


class CompiledCells(ShimTestCase):
    """Code compiled and freed in a loop (IPython cells, exec): a snippet whose code object, file
    name and line table took the addresses of an earlier one's must not be reported under that
    earlier snippet's file and line (PythonCodeIdentity)."""

    def check_cells(self, python, mode):
        script = os.path.join(SCRIPTS, "compiled_cells.py")
        r = run([python, script, mode], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        exec_line = markers(script)["exec_cell"]
        for i in range(1, 21):
            frames = python_frames(site_by_size(r.report, i * MiB))
            self.assertEqual([(f["file"], f["function"], f["line"]) for f in frames[1:3]],
                             [(f"<cell-{i:03d}>", "<module>", i + 1), (script, "<module>", exec_line)], f"cell {i}")

    def test_each_cell_keeps_its_own_file_and_line(self):
        for python, version in interpreters():
            with self.subTest(python=python):
                # File names kept alive in linecache, as IPython keeps them: every version.
                self.check_cells(python, "linecache")
                # File names freed with their code: only 3.12+ number their code objects
                # (co_version); before, such a cell can take an earlier one's file and line
                # (docs/python.md, "Limits").
                if version >= (3, 12):
                    self.check_cells(python, "plain")
