"""One safe-output rule for every file the shim writes (issue 17): the metrics file replaces only a
regular file that gpushim wrote; anything else at its path gets one gpushim: line and is never
written. Template fields become one file-name component. /dev/stdout and /dev/stderr get the
output in the process's own streams. A path too long for the system falls back to $TMPDIR."""
import json
import os
import stat
import tempfile

from shimtest import ShimTestCase, program, run

LEAK = program("e2e_leak_two_sites")


class MetricsFileRule(ShimTestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpushim-safe-")

    def metrics_run(self, path):
        return run([LEAK], env={"GPUSHIM_METRICS": path, "GPUSHIM_SUMMARY": "0"}, workdir=self.dir)

    def test_a_file_gpushim_did_not_write_is_left_alone(self):
        path = os.path.join(self.dir, "m.prom")
        with open(path, "w") as f:
            f.write("precious\n")
        r = self.metrics_run(path)
        self.assertRanOK(r)
        with open(path) as f:
            self.assertEqual(f.read(), "precious\n")
        lines = [l for l in r.shim_lines() if "metrics" in l]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("gpushim replaces only files it wrote itself", lines[0])
        self.assertEqual(sorted(os.listdir(self.dir)), ["m.prom", "report.json"])  # no temporary left

    def test_a_fifo_a_symlink_and_a_directory_are_never_replaced(self):
        fifo = os.path.join(self.dir, "fifo.prom")
        os.mkfifo(fifo)
        victim = os.path.join(self.dir, "victim")
        with open(victim, "w") as f:
            f.write("victim\n")
        link = os.path.join(self.dir, "link.prom")
        os.symlink(victim, link)
        directory = os.path.join(self.dir, "dir.prom")
        os.mkdir(directory)
        for path, kind in ((fifo, stat.S_ISFIFO), (link, stat.S_ISLNK), (directory, stat.S_ISDIR)):
            with self.subTest(path=os.path.basename(path)):
                r = self.metrics_run(path)
                self.assertRanOK(r)
                self.assertTrue(kind(os.lstat(path).st_mode))
                self.assertEqual(len([l for l in r.shim_lines() if "metrics" in l]), 1, r.stderr)
        with open(victim) as f:
            self.assertEqual(f.read(), "victim\n")

    def test_its_own_file_of_an_earlier_run_is_replaced(self):
        path = os.path.join(self.dir, "m.prom")
        first = self.metrics_run(path)
        self.assertRanOK(first)
        with open(path) as f:
            before = f.read()
        second = self.metrics_run(path)
        self.assertRanOK(second)
        self.assertFalse([l for l in second.shim_lines() if "metrics" in l], second.stderr)
        with open(path) as f:
            after = f.read()
        self.assertNotEqual(before, after)  # another process: another pid and start time
        self.assertTrue(after.startswith("# HELP gpushim_"))

    def test_dev_stdout_gets_the_metrics_in_the_programs_stdout(self):
        r = self.metrics_run("/dev/stdout")
        self.assertRanOK(r)
        self.assertIn("# HELP gpushim_", r.stdout)
        self.assertFalse([l for l in r.shim_lines() if "not writing" in l or "cannot" in l], r.stderr)


class ReportTargets(ShimTestCase):
    def test_dev_stdout_and_dev_stderr_get_the_report_itself(self):
        for target in ("/dev/stdout", "/dev/stderr"):
            with self.subTest(target=target):
                r = run([LEAK], env={"GPUSHIM_REPORT": target, "GPUSHIM_SUMMARY": "0"}, expect_report=False)
                self.assertEqual(r.returncode, 0, r.stderr)
                text = r.stdout if target == "/dev/stdout" else r.stderr
                start = text.index('{"schema"') if '{"schema"' in text else text.index("{")
                report = json.JSONDecoder().raw_decode(text[start:])[0]
                self.assertEqual(report["schema"], "gpushim-report/1")
                self.assertFalse(os.path.exists(target + ".1"))
                if target == "/dev/stdout":
                    # The program's own output, still in stdio's buffer when the report was written
                    # (a pipe is fully buffered), comes first, whole: the report landed inside it,
                    # splitting a line (a helper's find), until the report flushed it first.
                    self.assertTrue(r.stdout.startswith("done\n"), r.stdout[:200])

    def test_template_fields_stay_one_file_name_component(self):
        wd = tempfile.mkdtemp(prefix="gpushim-safe-")
        inner = os.path.join(wd, "reports")
        os.mkdir(inner)
        r = run([LEAK], env={"GPUSHIM_REPORT": os.path.join(inner, "r.%r.json"), "RANK": "../../x",
                             "GPUSHIM_SUMMARY": "0"}, expect_report=False, workdir=wd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.listdir(inner), ["r..._.._x.json"])
        self.assertEqual(sorted(os.listdir(wd)), ["reports"])

    def test_a_named_path_too_long_is_one_line_and_no_file(self):
        wd = tempfile.mkdtemp(prefix="gpushim-safe-")
        tmp = tempfile.mkdtemp(prefix="gpushim-tmpdir-")
        wanted = os.path.join(wd, "d" * 300, "r.json")  # one component past NAME_MAX
        r = run([LEAK], env={"GPUSHIM_REPORT": wanted, "TMPDIR": tmp, "GPUSHIM_SUMMARY": "0"}, expect_report=False,
                workdir=wd)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.shim_lines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("File name too long", lines[0])
        self.assertEqual(os.listdir(tmp), [])


class ConfigErrors(ShimTestCase):
    def test_one_line_per_configuration_error(self):
        r = run([LEAK], env={"GPUSHIM_STACK_DEPTH": "lots"}, expect_report=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(r.shim_lines()), 1, r.stderr)
        self.assertIn("GPUSHIM_STACK_DEPTH='lots' is invalid", r.shim_lines()[0])
        self.assertIn("gpushim is off", r.shim_lines()[0])
        r = run([LEAK], env={"GPUSHIM_POLICY": "passthrough", "GPUSHIM_QUARANTINE": "0",
                             "GPUSHIM_SMALL_SEGMENT": "4MiB"}, expect_report=False)
        self.assertEqual(len(r.shim_lines()), 2, r.stderr)
        self.assertTrue(all("passthrough" in l for l in r.shim_lines()), r.stderr)

    def test_a_setting_of_the_other_pool_is_one_line_and_the_shim_stays_on(self):
        r = run([LEAK], env={"GPUSHIM_POLICY": "vmm", "GPUSHIM_MAX_SPLIT": "64MiB", "GPUSHIM_SUMMARY": "0"})
        self.assertRanOK(r)
        self.assertEqual(r.report["policy"], "vmm")
        self.assertEqual(r.shim_lines(), ["gpushim: GPUSHIM_MAX_SPLIT=64MiB has no effect: it sets the caching "
                                          "policy's segments, and GPUSHIM_POLICY=vmm maps 2 MiB chunks"], r.stderr)


class OutOfMemoryLines(ShimTestCase):
    def test_oom_lines_are_rate_limited_with_a_final_count(self):
        r = run([program("e2e_cap_and_oom"), "64", "10", "0", "99"],
                env={"GPUSHIM_LIMIT": "200MiB", "GPUSHIM_SUMMARY": "0"})
        self.assertRanOK(r)
        self.assertEqual(json.loads(r.stdout.strip().splitlines()[-1])["refused_again"], 99)
        lines = [l for l in r.shim_lines() if "out of memory on device" in l]
        self.assertEqual(len(lines), 16, r.stderr)
        # Worded as the exit summary's line of the same event (requested first, "cached N").
        self.assertRegex(lines[0], r"^gpushim: out of memory on device 0: requested [0-9.]+ MiB; allocated [0-9.]+ MiB, "
                                   r"reserved [0-9.]+ MiB \(cached [0-9.]+ [KMG]?i?B, largest free block ")
        self.assertIn("further out-of-memory errors are counted", lines[-1])
        self.assertIn("gpushim: 100 out-of-memory errors in all (84 not printed above", r.stderr)
        self.assertEqual(r.device(0)["pool"]["ooms"], 100)
