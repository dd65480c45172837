"""scripts/gpushim-plot: every failure is one "gpushim-plot:" line and a non-zero exit with bounded
memory (bad output names, full disks, damaged reports, device files as input, no matplotlib), and
the drawing keeps labels off the curves and iteration marks from hiding them."""
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import unittest

from shimtest import ShimTestCase, program
from pythons import interpreters
from test_traces import ANALYZE, LEAK_PY, PLOT, require_plot_python, traced

PLOT_PYTHON = "/usr/bin/python3"  # Debian's, with python3-matplotlib (the script's #! line)


def plot(args, env=None, limit_memory=False):
    def cap():
        # Reading /dev/zero whole would pass this; python with matplotlib stays far below it.
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    e = dict(os.environ, GPUSHIM_ANALYZE=ANALYZE)
    e.update(env or {})
    return subprocess.run([PLOT_PYTHON, PLOT] + args, capture_output=True, text=True, timeout=120, env=e,
                          preexec_fn=cap if limit_memory else None)


class PlotFailures(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpushim-plot-")
        cls.report = os.path.join(cls.dir, "r.json")
        with open(cls.report, "w") as f:
            json.dump({"schema": "gpushim-report/1", "pid": 1, "exe": "/bin/x", "policy": "caching",
                       "devices": [{"device": 0, "peak_allocated_bytes": 1 << 20, "peak_reserved_bytes": 2 << 20}],
                       "timeline": [{"t_s": 0.1, "device": 0, "allocated": 1 << 20, "reserved": 2 << 20}]}, f)

    def stand_in_matplotlib(self, name, body):
        """A folder for PYTHONPATH whose `matplotlib` package runs `body` when imported."""
        folder = os.path.join(self.dir, name)
        os.makedirs(os.path.join(folder, "matplotlib"), exist_ok=True)
        with open(os.path.join(folder, "matplotlib", "__init__.py"), "w") as f:
            f.write(body + "\n")
        return folder

    def assert_one_line_error(self, proc, status, text):
        self.assertEqual(proc.returncode, status, proc.stderr)
        self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)
        self.assertTrue(proc.stderr.startswith("gpushim-plot: "), proc.stderr)
        self.assertIn(text, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)

    def test_an_output_format_matplotlib_cannot_write(self):
        out = os.path.join(self.dir, "x.txt")
        self.assert_one_line_error(plot([self.report, "-o", out]), 2, "cannot write .txt images")
        self.assertFalse(os.path.exists(out))

    def test_a_full_disk_is_an_error_and_the_name_is_kept(self):
        require_plot_python()
        self.assert_one_line_error(plot([self.report, "-o", "/dev/full"]), 1, "cannot write /dev/full: No space left")
        # Without an extension the image is PNG, written exactly where asked (never NAME.png).
        out = os.path.join(self.dir, "noext")
        proc = plot([self.report, "-o", out])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertFalse(os.path.exists(out + ".png"))

    def test_the_input_itself_is_never_the_output(self):
        # By any name: a report without an extension (-o without one is PNG), a hard link, a
        # symlink, all with a .png name. Before, the PNG replaced the report that was drawn.
        with open(self.report, "rb") as f:
            original = f.read()
        noext = os.path.join(self.dir, "report")
        with open(noext, "wb") as f:
            f.write(original)
        hard, sym = os.path.join(self.dir, "hard.png"), os.path.join(self.dir, "sym.png")
        os.link(self.report, hard)
        os.symlink(self.report, sym)
        try:
            for source, out in ((noext, noext), (self.report, hard), (self.report, sym)):
                with self.subTest(out=os.path.basename(out)):
                    self.assert_one_line_error(plot([source, "-o", out]), 1, "is the input")
                    with open(source, "rb") as f:
                        self.assertEqual(f.read(), original)
        finally:
            for path in (noext, hard, sym):
                os.unlink(path)

    def test_a_report_of_another_schema_version_is_refused(self):
        # gpushim-plot took any "gpushim-report/N" and drew what its fields happened to hold, where
        # gpushim-analyze refuses all but /1.
        require_plot_python()
        path = os.path.join(self.dir, "v2.json")
        with open(self.report) as f:
            doc = json.load(f)
        doc["schema"] = "gpushim-report/2"
        with open(path, "w") as f:
            json.dump(doc, f)
        out = os.path.join(self.dir, "v2.png")
        self.assert_one_line_error(plot([path, "-o", out]), 1,
                                   "unsupported report schema 'gpushim-report/2' (this tool reads gpushim-report/1)")
        self.assertFalse(os.path.exists(out))

    def test_damaged_reports(self):
        require_plot_python()
        for name, doc, missing in (
                ("timeline.json", {"schema": "gpushim-report/1", "devices": [{"device": 0}],
                                   "timeline": [{"device": 0, "t_s": 1.0, "reserved": 5}]}, "allocated"),
                ("device.json", {"schema": "gpushim-report/1", "devices": [{"live_bytes": 1}]}, "device"),
                ("types.json", {"schema": "gpushim-report/1", "devices": [{"device": "zero"}]}, "device")):
            with self.subTest(name=name):
                path = os.path.join(self.dir, name)
                with open(path, "w") as f:
                    json.dump(doc, f)
                self.assert_one_line_error(plot([path, "-o", os.path.join(self.dir, "d.png")]), 1, "damaged report")
                self.assertFalse(os.path.exists(os.path.join(self.dir, "d.png")))

    def test_a_field_of_the_wrong_type_is_named_in_one_line(self):
        # What gpushim-analyze refuses, naming the field, gpushim-plot refused with a TypeError's
        # traceback (a byte count that is a string) or drew (a duration that is a string, a
        # timeline that is an object).
        require_plot_python()
        base = {"schema": "gpushim-report/1", "pid": 1, "exe": "/bin/x", "policy": "caching", "duration_s": 0.2,
                "devices": [{"device": 0, "live_bytes": 1 << 20, "limit_bytes": 0, "peak_allocated_bytes": 1 << 20,
                             "peak_reserved_bytes": 2 << 20, "pool": {"reserved_bytes": 2 << 20}}],
                "ooms": [{"t_s": 0.1, "device": 0, "requested": 1 << 30}],
                "timeline": [{"t_s": 0.1, "device": 0, "allocated": 1 << 20, "reserved": 2 << 20}]}
        for where, value, message in (
                (("devices", 0, "live_bytes"), "lots", "devices[0].live_bytes: expected an unsigned integer"),
                (("devices", 0, "limit_bytes"), "x", "devices[0].limit_bytes: expected an unsigned integer"),
                (("devices", 0, "peak_reserved_bytes"), -5,
                 "devices[0].peak_reserved_bytes: expected an unsigned integer"),
                (("devices", 0, "pool"), [], "devices[0].pool: expected an object"),
                (("duration_s",), "long", "duration_s: expected a number"),
                (("timeline",), {}, "timeline: expected an array"),
                (("timeline", 0, "t_s"), True, "timeline[0].t_s: expected a number"),
                (("ooms", 0, "requested"), "1 GiB", "ooms[0].requested: expected an unsigned integer")):
            with self.subTest(field=message.split(":")[0]):
                doc = json.loads(json.dumps(base))
                parent = doc
                for key in where[:-1]:
                    parent = parent[key]
                parent[where[-1]] = value
                path, out = os.path.join(self.dir, "typed.json"), os.path.join(self.dir, "typed.png")
                with open(path, "w") as f:
                    json.dump(doc, f)
                proc = plot([path, "-o", out])
                self.assert_one_line_error(proc, 1, message)
                self.assertEqual(proc.stderr, f"gpushim-plot: {path}: a damaged report: {message}\n")
                self.assertFalse(os.path.exists(out))

    def test_an_empty_input_is_said_to_be_empty(self):
        # As gpushim-analyze says it; the JSON parser's "Expecting value: line 1 column 1 (char 0)"
        # was the message.
        require_plot_python()
        empty = os.path.join(self.dir, "empty.json")
        open(empty, "w").close()
        out = os.path.join(self.dir, "empty.png")
        self.assert_one_line_error(plot([empty, "-o", out]), 1,
                                   f"{empty} is empty: no report or trace was written into it")
        proc = subprocess.run([PLOT_PYTHON, PLOT, "-", "-o", out], input="", capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
        self.assertEqual(proc.stderr, "gpushim-plot: - is empty: no report or trace was written into it\n")
        self.assertEqual(proc.returncode, 1)
        self.assertFalse(os.path.exists(out))

    def test_dash_reads_standard_input(self):
        # As gpushim-analyze reads it (`cat run.json | gpushim-plot - -o x.png`); it was taken as a
        # file's name ("cannot read -: No such file or directory"), here one that exists and holds
        # no report: standard input is read all the same.
        require_plot_python()
        where = tempfile.mkdtemp(prefix="gpushim-plot-stdin-")
        with open(os.path.join(where, "-"), "w") as f:
            f.write("not a report\n")
        from_file = os.path.join(self.dir, "stdin_from_file.png")
        self.assertEqual(plot([self.report, "-o", from_file]).returncode, 0)
        with open(self.report, "rb") as f:
            report = f.read()
        for name, payload in (("plain", report), ("gzip", gzip.compress(report))):
            with self.subTest(input=name):
                out = os.path.join(self.dir, f"stdin_{name}.png")
                proc = subprocess.run([PLOT_PYTHON, PLOT, "-", "-o", out], input=payload, capture_output=True,
                                      timeout=120, cwd=where, env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
                self.assertEqual(proc.returncode, 0, proc.stderr)
                with open(out, "rb") as a, open(from_file, "rb") as b:
                    self.assertEqual(a.read(), b.read())
        # Refusals name it "-", as gpushim-analyze's do.
        proc = subprocess.run([PLOT_PYTHON, PLOT, "-", "-o", os.path.join(self.dir, "stdin_bad.png")],
                              input=report.replace(b'"pid": 1', b'"pid": "one"'), capture_output=True, timeout=120,
                              env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
        self.assertEqual(proc.stderr.decode(), "gpushim-plot: -: a damaged report: pid: expected an integer\n")

    def test_a_damaged_input_is_refused_before_matplotlib_is_imported(self):
        # matplotlib's import is most of a refusal's time (~0.5 s): the input is read and checked
        # first. A matplotlib that stops the process when imported shows the order.
        fake = self.stand_in_matplotlib("fake-matplotlib", "raise SystemExit('gpushim-plot: matplotlib imported')")
        damaged = os.path.join(self.dir, "cut.json")
        with open(damaged, "w") as f:
            f.write('{"schema": "gpushim-report/1", "devices": [{"device": 0}')
        proc = plot([damaged, "-o", os.path.join(self.dir, "cut.png")], env={"PYTHONPATH": fake})
        self.assert_one_line_error(proc, 1, damaged)
        self.assertNotIn("matplotlib imported", proc.stderr)
        # The fake is what a good input then imports: the order, not a missing import, is tested.
        proc = plot([self.report, "-o", os.path.join(self.dir, "good.png")], env={"PYTHONPATH": fake})
        self.assertIn("matplotlib imported", proc.stderr)

    def test_device_files_and_junk_are_refused_with_bounded_memory(self):
        require_plot_python()
        # Binary data opening with '{', as /dev/urandom does one time in 256 (CI once met it: the
        # plot read 256 MiB of it and named the size), is refused at its first block like the rest.
        brace = os.path.join(self.dir, "brace.bin")
        with open(brace, "wb") as f:
            f.write((b"{" + bytes(range(256))) * 4096)
        for source in ("/dev/zero", "/dev/urandom", brace):
            with self.subTest(source=source):
                proc = plot([source, "-o", os.path.join(self.dir, "z.png")], limit_memory=True)
                self.assert_one_line_error(proc, 1, f"{source}: not a gpushim report or trace")
                # Refused from its head, not after reading and parsing it (that names the JSON error).
                self.assertTrue(proc.stderr.rstrip().endswith("not a gpushim report or trace"), proc.stderr)

    def test_a_failed_write_leaves_the_earlier_image_whole(self):
        # The image was written over its target in place: a write cut short (a full disk, here the
        # file size limit) left a truncated image where the earlier one had been.
        require_plot_python()
        out_dir = tempfile.mkdtemp(prefix="gpushim-plot-out-")
        out = os.path.join(out_dir, "run.png")
        self.assertEqual(plot([self.report, "-o", out]).returncode, 0)  # matplotlib's caches exist from here on
        with open(out, "wb") as f:
            f.write(b"the earlier image")
        os.chmod(out, 0o640)

        def small_files():
            resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # Python ignores SIGXFSZ: write() fails
        proc = subprocess.run([PLOT_PYTHON, PLOT, self.report, "-o", out], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE), preexec_fn=small_files)
        self.assert_one_line_error(proc, 1, f"cannot write {out}: File too large")
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"the earlier image")
        self.assertEqual(os.listdir(out_dir), ["run.png"])  # no temporary file left
        # A successful plot replaces the image and keeps its mode; through a link, the link stays.
        link = os.path.join(out_dir, "latest.png")
        os.symlink("run.png", link)
        self.assertEqual(plot([self.report, "-o", link]).returncode, 0)
        self.assertTrue(os.path.islink(link))
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertEqual(os.stat(out).st_mode & 0o777, 0o640)
        self.assertEqual(sorted(os.listdir(out_dir)), ["latest.png", "run.png"])

    def test_dash_writes_the_image_to_stdout(self):
        # As `gpushim-analyze export -o -` does; it wrote a file named "-" instead.
        require_plot_python()
        where = tempfile.mkdtemp(prefix="gpushim-plot-dash-")
        proc = subprocess.run([PLOT_PYTHON, PLOT, self.report, "-o", "-"], capture_output=True, timeout=120, cwd=where,
                              env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(os.listdir(where), [])

    def test_a_trace_from_a_pipe_draws_as_from_its_file(self):
        # `gpushim-plot <(zcat run.trace.gz)`: the head read here emptied the pipe's start, and
        # gpushim-analyze, given the path again, could not open it ("/dev/fd/63: No such file").
        require_plot_python()
        _, trace = traced([program("e2e_leak_two_sites")])
        with open(trace, "rb") as f:
            data = f.read()
        from_file = os.path.join(self.dir, "from_file.png")
        self.assertEqual(plot([trace, "-o", from_file]).returncode, 0)
        for name, payload in (("plain", data), ("gzip", gzip.compress(data))):
            with self.subTest(input=name):
                for source in ("/dev/stdin", "-"):
                    out = os.path.join(self.dir, f"from_pipe_{name}.png")
                    proc = subprocess.run([PLOT_PYTHON, PLOT, source, "-o", out], input=payload, capture_output=True,
                                          timeout=120, env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
                    self.assertEqual(proc.returncode, 0, (source, proc.stderr))
                    with open(out, "rb") as a, open(from_file, "rb") as b:
                        self.assertEqual(a.read(), b.read(), source)
        # A trace cut inside its header, from a pipe: gpushim-analyze's one line, naming the input.
        proc = subprocess.run([PLOT_PYTHON, PLOT, "/dev/stdin", "-o", os.path.join(self.dir, "cut.png")],
                              input=data[:12], capture_output=True, text=False, timeout=120,
                              env=dict(os.environ, GPUSHIM_ANALYZE=ANALYZE))
        self.assertEqual(proc.returncode, 1)
        self.assertEqual(proc.stderr.decode().splitlines(),
                         ["gpushim-plot: gpushim-analyze export: /dev/stdin: a gpushim trace cut short inside its "
                          "header chunk (torn chunk header at byte 8): nothing to read"])

    def test_a_refused_pipe_is_not_waited_for(self):
        # gpushim-analyze refuses what it was fed while the pipe's writer has more to come, and
        # never sends it (`producer | gpushim-plot /dev/stdin`): gpushim-plot answers, rather than
        # waiting on its thread that feeds the pipe on to gpushim-analyze.
        require_plot_python()
        refuser = os.path.join(self.dir, "refusing-analyze")
        with open(refuser, "w") as f:
            f.write("#!/bin/sh\necho 'gpushim-analyze export: refused' >&2\nexit 1\n")
        os.chmod(refuser, 0o755)
        proc = subprocess.Popen([PLOT_PYTHON, PLOT, "/dev/stdin", "-o", os.path.join(self.dir, "refused.png")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ, GPUSHIM_ANALYZE=refuser))
        try:
            proc.stdin.write(b"GPUSHIMT" + bytes(1 << 16))  # a head, and the feeder's first read
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            returncode = proc.wait(timeout=60)  # the pipe stays open: only an answer ends this
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.fail("gpushim-plot waited for the end of a pipe gpushim-analyze had refused")
        finally:
            proc.stdin.close()
        self.assertEqual(returncode, 1)
        self.assertEqual(proc.stderr.read().decode().splitlines(), ["gpushim-plot: gpushim-analyze export: refused"])
        proc.stdout.close()
        proc.stderr.close()

    def test_a_python_without_matplotlib_hands_over_to_one_with_it(self):
        require_plot_python()
        # `python3 -S` has no site packages, as a virtual environment's python3 first on PATH may
        # lack matplotlib: the script runs itself again with one that has it, once.
        out = os.path.join(self.dir, "handed.png")
        e = dict(os.environ, GPUSHIM_ANALYZE=ANALYZE)
        e.pop("GPUSHIM_PLOT_REEXEC", None)
        proc = subprocess.run([PLOT_PYTHON, "-S", PLOT, self.report, "-o", out], capture_output=True, text=True,
                              timeout=120, env=e)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_a_broken_matplotlib_hands_a_pipe_over_unread(self):
        # A matplotlib that is found but fails to import (a numpy built for another ABI): the input
        # read first from a pipe would be gone for the Python handed over to (a review helper's
        # find, 2026-11-29): with a pipe, matplotlib is imported before the input is read.
        # Handed over to a Python that has matplotlib: on a GPU machine Debian's may not (an H200's
        # image, run 8), where the test once handed over to it all the same.
        working = require_plot_python()
        broken = self.stand_in_matplotlib("broken-matplotlib", "raise ImportError('built for another numpy')")
        clean = os.path.join(self.dir, "clean-python")
        with open(clean, "w") as f:
            f.write(f"#!/bin/sh\nunset PYTHONPATH\nexec {working} \"$@\"\n")
        os.chmod(clean, 0o755)
        out = os.path.join(self.dir, "piped.png")
        with open(self.report, "rb") as f:
            payload = f.read()
        e = dict(os.environ, GPUSHIM_ANALYZE=ANALYZE, PYTHONPATH=broken, GPUSHIM_PYTHON=clean)
        e.pop("GPUSHIM_PLOT_REEXEC", None)
        for source in ("/dev/stdin", "-"):  # "-" is standard input, read as a pipe is
            with self.subTest(source=source):
                if os.path.exists(out):
                    os.unlink(out)
                proc = subprocess.run([PLOT_PYTHON, PLOT, source, "-o", out], input=payload, capture_output=True,
                                      timeout=120, env=e)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                with open(out, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_without_matplotlib_the_message_names_the_package(self):
        shadow = tempfile.mkdtemp(prefix="gpushim-nompl-")
        os.mkdir(os.path.join(shadow, "matplotlib"))
        with open(os.path.join(shadow, "matplotlib", "__init__.py"), "w") as f:
            f.write("raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
        proc = plot([self.report, "-o", os.path.join(self.dir, "m.png")], env={"PYTHONPATH": shadow})
        self.assert_one_line_error(proc, 1, "python3-matplotlib")


def layout_of(testcase, source, name):
    """Draws `source` and returns where its labels and curves went (pixels, y upwards)."""
    require_plot_python()
    out = tempfile.mkdtemp(prefix="gpushim-plot-")
    layout = os.path.join(out, "layout.json")
    proc = plot([source, "-o", os.path.join(out, name), "--layout-json", layout])
    testcase.assertEqual(proc.returncode, 0, proc.stderr)
    with open(layout) as f:
        return json.load(f)


class PlotLayout(ShimTestCase):
    def assert_labels_clear(self, axes):
        texts = axes["texts"]
        self.assertTrue(texts)
        for i, (x0, y0, w, h) in enumerate(texts):
            for (x1, y1, w1, h1) in texts[i + 1:]:
                self.assertFalse(x0 < x1 + w1 and x1 < x0 + w and y0 < y1 + h1 and y1 < y0 + h, "labels overlap")
            # No curve passes under a label: every point of every line within its columns lies below it.
            for line in axes["lines"]:
                pts = line["points"]
                for (ax_, ay), (bx, by) in zip(pts, pts[1:] or pts):
                    if max(ax_, bx) >= x0 and min(ax_, bx) <= x0 + w:
                        self.assertLess(max(ay, by), y0, f"{line['label']} runs under the label")

    def test_hundreds_of_iteration_marks_become_ticks_and_labels_stay_clear(self):
        _, trace = traced([program("e2e_train_loop"), "300"])
        [axes] = layout_of(self, trace, "marks.png")
        # One line per curve, not one per mark: no grey curtain.
        self.assertLess(len(axes["lines"]), 10, [l["label"] for l in axes["lines"]])
        self.assert_labels_clear(axes)

    def test_the_oom_label_keeps_off_the_reserved_line_and_the_cap(self):
        _, trace = traced([program("e2e_cap_and_oom")], env={"GPUSHIM_LIMIT": "256MiB"})
        [axes] = layout_of(self, trace, "oom.png")
        labels = [l["label"] for l in axes["lines"]]
        self.assertIn("out of memory", labels)
        self.assertTrue(any(l.startswith("cap ") for l in labels))
        self.assert_labels_clear(axes)

    def test_a_panel_with_nothing_to_label_draws_without_a_warning(self):
        # A report whose timeline sampled one device of two (a run shorter than GPUSHIM_SAMPLE_MS
        # sampling) printed matplotlib's "No artists with labels found to put in legend" warning.
        require_plot_python()
        out = tempfile.mkdtemp(prefix="gpushim-plot-")
        report = os.path.join(out, "r.json")
        with open(report, "w") as f:
            json.dump({"schema": "gpushim-report/1", "pid": 1, "exe": "/bin/x", "policy": "caching",
                       "devices": [{"device": d, "peak_allocated_bytes": 1 << 20, "peak_reserved_bytes": 2 << 20}
                                   for d in (0, 1)],
                       "timeline": [{"t_s": 0.1, "device": 0, "allocated": 1 << 20, "reserved": 2 << 20}]}, f)
        proc = plot([report, "-o", os.path.join(out, "two.png")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("legend", proc.stderr)

    def test_a_reports_growth_suspect_is_named_as_from_its_trace(self):
        # The report path read 'growth' only as a list, under the trace timeline's key grew_bytes:
        # the shim writes {"suspects": [...]} with growth_bytes, so a report's plot never said what
        # grew. A Python program's suspect is named by its line, not by libffi's frame.
        for args in ([program("e2e_planted_leak")], [interpreters()[0][0], LEAK_PY, "20", "marks"]):
            with self.subTest(program=args[-1]):
                r, trace = traced(args)
                self.assertTrue(r.report["growth"]["suspects"], r.report["growth"])
                titles = [layout_of(self, source, "growth.png")[0]["title"] for source in (r.report_path, trace)]
                growing = [t.splitlines()[1] for t in titles]
                site = "leaky_step planted_leak.cpp:" if "e2e_planted_leak" in args[0] else "leaky_step planted_leak.py:"
                self.assertTrue(growing[0].startswith("growing steadily: " + site), titles)
                self.assertEqual(growing[0], growing[1])

    def test_a_python_programs_live_figure_is_named_at_its_teardown(self):
        # A Python program's live figure is of the moment its interpreter's teardown began; the
        # finalizers after it free what it held, so the curve ends near nothing. The footer said
        # "live at the end 40.0 MiB" beside a curve ending at 0 (a new user's report).
        finalizer_leak = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "finalizer_leak.py")
        r, trace = traced([interpreters()[0][0], finalizer_leak, "40", "del"])
        teardown = r.report["teardown"]
        self.assertTrue(teardown["observed"], r.report.get("teardown"))
        for source in (r.report_path, trace):
            with self.subTest(source=os.path.basename(source)):
                [axes] = layout_of(self, source, "teardown.png")
                footer = axes["title"].splitlines()[0]
                self.assertIn(f"live when the interpreter's teardown began ({teardown['began_s']:.2f} s) 40.0 MiB", footer)
                self.assertNotIn("live at the end", footer)
                self.assertIn("interpreter teardown began", [l["label"] for l in axes["lines"]])


if __name__ == "__main__":
    unittest.main()
