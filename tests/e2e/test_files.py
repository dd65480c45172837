"""Files the shim writes: created O_EXCL|O_NOFOLLOW with mode 0600 whatever the umask, never
overwriting anything (a suffix is added), never following a planted symlink; a default name in an
unwritable directory falls back to $TMPDIR with one notice, a path the user named that cannot be
created is one line and no file anywhere; a full disk costs the report, never the job."""
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import unittest

from pythons import interpreters
from shimtest import BUILD, FAKECUDA, SHIM, PRELOAD_FIRST, ShimTestCase, base_env, check_sanitizer_clean, program

LEAK = program("e2e_leak_two_sites")
MOVES_AWAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "moves_away.py")


def run_leak(workdir, report, extra_env=None, preexec_fn=None, leak=LEAK):
    """`report` None: the default name, in `workdir`."""
    env = base_env(dict({"GPUSHIM_SUMMARY": "0"}, **({"GPUSHIM_REPORT": report} if report else {}),
                        **(extra_env or {})))
    proc = subprocess.run([leak], env=env, cwd=workdir, capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec_fn)
    check_sanitizer_clean(proc.stderr, LEAK)
    return proc


def libraries_of_this_build(paths):
    """{soname: file} of the shared libraries `paths` load from inside this build tree or bundle
    (a bundle's lib/: Abseil, libunwind, libdw...), the simulated device's excepted."""
    inside, fake = os.path.realpath(BUILD) + "/", os.path.realpath(FAKECUDA) + "/"
    found = {}
    for path in paths:
        env = base_env(preload=False)
        out = subprocess.run(["ldd", path], env=env, capture_output=True, text=True).stdout
        for soname, where in re.findall(r"^\s*(\S+) => (/\S+) \(0x", out, re.M):
            real = os.path.realpath(where)
            if real.startswith(inside) and not real.startswith(fake):
                found[soname] = real
    return found


def shim_lines(proc):
    return [l for l in proc.stderr.splitlines() if l.startswith("gpushim:")]


def load(path):
    with open(path) as f:
        return json.load(f)


def is_report(path):
    return load(path)["schema"] == "gpushim-report/1"


class WorkingDirectory(ShimTestCase):
    def test_relative_names_stay_where_the_first_cuda_call_was(self):
        # A program that changes directory after its first CUDA call (Hydra's job.chdir does, into
        # its output folder), even into one it then deletes: the report, named or by its default
        # name, lands beside the trace and the metrics file, in the directory of the first CUDA
        # call. It used to follow the program, apart from the trace, and a deleted directory lost it.
        python = interpreters()[0][0]
        for named in (True, False):
            for delete in (False, True):
                with self.subTest(named=named, delete=delete):
                    d = tempfile.mkdtemp(prefix="gpushim-files-")
                    env = {"GPUSHIM_TRACE": "t.trace", "GPUSHIM_METRICS": "m.prom", "GPUSHIM_SUMMARY": "0"}
                    if named:
                        env["GPUSHIM_REPORT"] = "r.json"
                    proc = subprocess.run([python, MOVES_AWAY, "delete" if delete else "keep"], env=base_env(env),
                                          cwd=d, capture_output=True, text=True, timeout=120)
                    check_sanitizer_clean(proc.stderr, python)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    self.assertEqual(shim_lines(proc), [], proc.stderr)
                    names = os.listdir(d)
                    reports = [n for n in names if (n == "r.json" if named else re.fullmatch(r"gpushim\..+\.json", n))]
                    self.assertEqual(len(reports), 1, names)
                    self.assertTrue(is_report(os.path.join(d, reports[0])))
                    self.assertIn("t.trace", names)
                    self.assertIn("m.prom", names)
                    if not delete:
                        self.assertEqual(os.listdir(os.path.join(d, "elsewhere")), [])
                    shutil.rmtree(d)


class Creation(ShimTestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpushim-files-")

    def test_mode_0600_even_with_umask_0(self):
        proc = run_leak(self.dir, os.path.join(self.dir, "r.json"), preexec_fn=lambda: os.umask(0))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        st = os.lstat(os.path.join(self.dir, "r.json"))
        self.assertTrue(stat.S_ISREG(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)

    def test_mode_0600_even_with_umask_0777(self):
        # The kernel applies the umask to O_CREAT and O_TMPFILE alike: under umask 0777 the report
        # and the trace came out mode 0000, unreadable by the user who asked for them.
        report, trace = os.path.join(self.dir, "r.json"), os.path.join(self.dir, "t.trace")
        proc = run_leak(self.dir, report, {"GPUSHIM_TRACE": trace}, preexec_fn=lambda: os.umask(0o777))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for path in (report, trace):
            st = os.lstat(path)
            self.assertTrue(stat.S_ISREG(st.st_mode))
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o600, path)
        self.assertTrue(is_report(report))

    def test_existing_file_is_never_overwritten(self):
        path = os.path.join(self.dir, "r.json")
        with open(path, "w") as f:
            f.write("precious\n")
        for expected in ("r.1.json", "r.2.json"):
            proc = run_leak(self.dir, path)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertTrue(is_report(os.path.join(self.dir, expected)))
            # GPUSHIM_SUMMARY=0 (run_leak): no summary names the file, so one line says where it went.
            self.assertIn(f"gpushim: report written to {self.dir}/{expected} ({path} was taken)\n", proc.stderr)
        with open(path) as f:
            self.assertEqual(f.read(), "precious\n")
        self.assertEqual(sorted(os.listdir(self.dir)), ["r.1.json", "r.2.json", "r.json"])

    def test_planted_symlinks_are_never_followed(self):
        victim = os.path.join(tempfile.mkdtemp(prefix="gpushim-victim-"), "victim")
        with open(victim, "w") as f:
            f.write("victim\n")
        os.symlink(victim, os.path.join(self.dir, "r.json"))
        missing = os.path.join(os.path.dirname(victim), "would-be-created")
        os.symlink(missing, os.path.join(self.dir, "r.1.json"))  # dangling: O_CREAT would create its target
        proc = run_leak(self.dir, os.path.join(self.dir, "r.json"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(victim) as f:
            self.assertEqual(f.read(), "victim\n")
        self.assertFalse(os.path.exists(missing))
        self.assertTrue(os.path.islink(os.path.join(self.dir, "r.json")))
        self.assertTrue(is_report(os.path.join(self.dir, "r.2.json")))

    def test_many_processes_one_template_distinct_files(self):
        path = os.path.join(self.dir, "r.json")
        procs = [subprocess.Popen([LEAK], env=base_env({"GPUSHIM_REPORT": path, "GPUSHIM_SUMMARY": "0"}),
                                  cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(6)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            check_sanitizer_clean(err, LEAK)
            self.assertEqual(p.returncode, 0, err)
        names = sorted(os.listdir(self.dir))
        self.assertEqual(len(names), 6, names)
        pids = {load(os.path.join(self.dir, n))["pid"] for n in names}
        self.assertEqual(len(pids), 6)


class Fallback(ShimTestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpushim-files-")
        self.tmp = tempfile.mkdtemp(prefix="gpushim-tmpdir-")
        os.chmod(self.tmp, 0o777)
        os.chmod(self.dir, 0o755)

    def staged_for_anyone(self, extra):
        """Copies the program, the shim, the libraries of this build they load and the simulated
        CUDA libraries into a directory anyone can read, laid out as a build tree or bundle is
        (bin/, lib/: a bundle's programs find their libraries through $ORIGIN/../lib); returns the
        program's copy and `extra` with the environment that uses them."""
        stage = os.path.join(self.dir, "stage")
        for d in ("bin", "lib", "cuda"):
            os.makedirs(os.path.join(stage, d), 0o755)
        leak = shutil.copy2(LEAK, os.path.join(stage, "bin"))
        shim = shutil.copy2(SHIM, os.path.join(stage, "lib"))
        # The libraries the shim dlopens (no ldd lists them) too, where they sit beside it, as in a
        # bundle: its core (loaded at the first CUDA call), and without libunwind and libdw the
        # copy falls back to slower stacks and says so on stderr.
        dlopened = [p for p in (os.path.join(os.path.dirname(os.path.realpath(SHIM)), n)
                                for n in ("libgpushim-core.so", "libunwind.so.8", "libdw.so.1")) if os.path.exists(p)]
        for path in dlopened:
            shutil.copy2(path, os.path.join(stage, "lib"))
        for name, path in libraries_of_this_build([LEAK, SHIM] + dlopened).items():
            shutil.copy2(path, os.path.join(stage, "lib", name))
        cuda = os.path.join(stage, "cuda")
        for name in os.listdir(FAKECUDA):
            if name.startswith("lib") and ".so" in name:
                shutil.copy2(os.path.realpath(os.path.join(FAKECUDA, name)), os.path.join(cuda, name))
        for root, dirs, files in os.walk(stage):
            for n in dirs + files:
                os.chmod(os.path.join(root, n), 0o755)
        env = dict(extra)
        env["LD_PRELOAD"] = shim if not PRELOAD_FIRST else PRELOAD_FIRST + ":" + shim
        library_path = base_env().get("LD_LIBRARY_PATH", "").replace(FAKECUDA, cuda)
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (library_path, os.path.join(stage, "lib")) if p)
        return leak, env

    def check_fallback(self, proc, wanted):
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = shim_lines(proc)
        self.assertEqual(len(lines), 1, proc.stderr)
        fallback = os.path.join(self.tmp, os.path.basename(wanted))
        self.assertEqual(lines[0].split(" wrote ")[-1], fallback + " instead")
        self.assertTrue(lines[0].startswith(f"gpushim: cannot create {wanted} ("), lines[0])
        self.assertTrue(is_report(fallback))

    def test_a_named_path_that_cannot_be_created_is_one_line_and_no_file(self):
        # Where the user looks is where they named: nothing lands anywhere else. The line names the
        # missing directory and how to make it (it named only the file, "No such file or
        # directory"); gpushim makes none itself. The metrics file says the same, and retries.
        for var, name in [("GPUSHIM_REPORT", "r.json"), ("GPUSHIM_TRACE", "t.bin"), ("GPUSHIM_METRICS", "m.prom")]:
            with self.subTest(var=var):
                parent = os.path.join(self.dir, "no", "such", "dir")
                wanted = os.path.join(parent, name)
                proc = run_leak(self.dir, None, {var: wanted, "TMPDIR": self.tmp,
                                                 **({"GPUSHIM_REPORT": "off"} if var != "GPUSHIM_REPORT" else {})})
                self.assertEqual(proc.returncode, 0, proc.stderr)
                lines = shim_lines(proc)
                why = f"its directory {parent} does not exist (gpushim creates no directories: mkdir -p {parent})"
                want = (f"gpushim: cannot update the metrics file {wanted}: {why}; retrying at every update"
                        if var == "GPUSHIM_METRICS" else f"gpushim: cannot create {wanted}: {why}")
                self.assertEqual(lines, [want], proc.stderr)
                self.assertEqual(os.listdir(self.tmp), [])
                self.assertEqual(os.listdir(self.dir), [])

    def test_a_missing_directory_is_named_as_a_shell_word(self):
        parent = os.path.join(self.dir, "it's here")
        proc = run_leak(self.dir, None, {"GPUSHIM_REPORT": os.path.join(parent, "r.json")})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        quoted = "'" + parent.replace("'", "'\\''") + "'"
        self.assertEqual(shim_lines(proc), [f"gpushim: cannot create {parent}/r.json: its directory {parent} does not "
                                            f"exist (gpushim creates no directories: mkdir -p {quoted})"], proc.stderr)

    def test_default_name_in_unwritable_directory_falls_back_to_tmpdir(self):
        locked = os.path.join(self.dir, "locked")
        os.mkdir(locked, 0o555)
        # Root ignores directory permissions: drop to an unprivileged user for the run.
        drop = None
        if os.getuid() == 0:
            def drop():
                os.setgid(65534)
                os.setuid(65534)
        extra = {"TMPDIR": self.tmp}
        leak = LEAK
        if drop is not None:
            # The unprivileged user must reach the program and the libraries wherever the checkout
            # lives (a clone under a 0700 home is common): a world-readable copy of each.
            leak, extra = self.staged_for_anyone(extra)
        proc = run_leak(locked, None, extra, preexec_fn=drop, leak=leak)
        self.assertIn("Permission denied", proc.stderr)
        lines = shim_lines(proc)
        self.assertEqual(len(lines), 1, proc.stderr)
        wanted = lines[0].split("gpushim: cannot create ")[-1].split(" (")[0]
        # The default name, in `locked` (named whole: the working directory of the first CUDA call).
        self.assertRegex(wanted, "^" + re.escape(os.path.realpath(locked)) + r"/gpushim\.e2e_leak_two_sites\.\d+\.json$")
        self.check_fallback(proc, wanted)
        self.assertEqual(os.listdir(locked), [])


def can_mount_tmpfs():
    if shutil.which("unshare") is None:
        return False
    d = tempfile.mkdtemp(prefix="gpushim-mnt-")
    return subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=4k", "none", d],
                          capture_output=True).returncode == 0


FULL_DISK_STAND_IN = os.path.join(os.path.dirname(SHIM), "..", "e2e-libs", "libgpushim_test_full_disk.so")


def on_full_disk(how, mnt, room, argv, env):
    """Runs argv with LD_PRELOAD of the shim while `mnt` has only `room` bytes left. `how`: "tmpfs"
    (a real 8 KiB tmpfs, in a user and mount namespace) or "stand-in" (write() interposed, for
    machines without namespaces). Returns the process and the names left in `mnt` afterwards."""
    preload = SHIM if not PRELOAD_FIRST else PRELOAD_FIRST + ":" + SHIM
    if how == "tmpfs":
        script = ('m="$1"; fill="$2"; pre="$3"; shift 3; '
                  'mount -t tmpfs -o size=8k none "$m" || exit 99; head -c "$fill" /dev/zero > "$m/filler"; '
                  'env LD_PRELOAD="$pre" "$@"; rc=$?; echo; ls -A "$m" | tr "\\n" " "; echo; exit $rc')
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", mnt, str(8192 - room), preload] + argv,
                              env=env, capture_output=True, text=True, timeout=300)
        out = proc.stdout.splitlines()
        left = out[-1].split() if out else []
        proc.stdout = "\n".join(out[:-2])
        return proc, sorted(n for n in left if n != "filler")
    env = dict(env, FULLDISK_DIR=os.path.realpath(mnt), FULLDISK_BYTES=str(room),
               LD_PRELOAD=(PRELOAD_FIRST + ":" if PRELOAD_FIRST else "") + FULL_DISK_STAND_IN + ":" + SHIM)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    return proc, sorted(os.listdir(mnt))


# The stand-in always runs; a real tmpfs too where the machine allows one.
FULL_DISKS = ["stand-in"] + (["tmpfs"] if can_mount_tmpfs() else [])


class DiskFull(ShimTestCase):
    def test_full_disk_costs_the_report_not_the_job(self):
        for how in FULL_DISKS:
            with self.subTest(how=how):
                mnt = os.path.realpath(tempfile.mkdtemp(prefix="gpushim-full-"))
                env = base_env({"GPUSHIM_REPORT": os.path.join(mnt, "r.json"), "GPUSHIM_SUMMARY": "0"}, preload=False)
                # About 2 KiB of room: the report (several KiB) cannot fit.
                proc, left = on_full_disk(how, mnt, 2192, [LEAK], env)
                check_sanitizer_clean(proc.stderr, LEAK)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                lines = shim_lines(proc)
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertTrue(lines[0].startswith(f"gpushim: no space left writing {mnt}/r.json ("), lines[0])
                self.assertTrue(lines[0].endswith("; partial file removed"), lines[0])
                self.assertEqual(left, [], "no partial report may be left behind")

    def test_full_disk_stops_tracing_and_keeps_the_job(self):
        for how in FULL_DISKS:
            with self.subTest(how=how):
                mnt = os.path.realpath(tempfile.mkdtemp(prefix="gpushim-full-"))
                env = base_env({"GPUSHIM_TRACE": os.path.join(mnt, "t.trace"), "GPUSHIM_REPORT": "off",
                                "GPUSHIM_SUMMARY": "0"}, preload=False)
                proc, _ = on_full_disk(how, mnt, 0, [program("e2e_soak"), "4", "2", "4000", "1", "1000", "8"], env)
                check_sanitizer_clean(proc.stderr, "e2e_soak")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                # One notice, however many events follow; the soak itself finished and checked its data.
                lines = shim_lines(proc)
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertIn(f"cannot write the trace {mnt}/t.trace: No space left on device; recording stopped",
                              lines[0])
                self.assertEqual(json.loads(proc.stdout.splitlines()[-1])["corruptions"], 0)


if __name__ == "__main__":
    unittest.main()
