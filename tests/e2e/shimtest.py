"""Helpers for end-to-end tests: run a real CUDA program under LD_PRELOAD=libgpushim.so and read
back what the shim wrote.

By default programs run on the simulated device (build/fakecuda). With GPUSHIM_TEST_REAL_GPU=1 they
run against NVIDIA's libcudart/libcuda instead, unchanged (the GPU validation suite does that).
"""
import atexit
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

# Every working directory and file a test makes with tempfile lives under one directory per test
# process, removed when it ends: a suite run used to leave ~2,000 directories in /tmp. Set
# GPUSHIM_TEST_KEEP_FILES=1 to keep them (the root is printed) and read what a failing test wrote.
tempfile.tempdir = tempfile.mkdtemp(prefix="gpushim-tests-")
os.chmod(tempfile.tempdir, 0o711)  # tests that drop privileges still reach their own directories
if os.environ.get("GPUSHIM_TEST_KEEP_FILES") == "1":
    print(f"gpushim tests: files kept under {tempfile.tempdir}", flush=True)
else:
    def _remove_test_files(root=tempfile.tempdir):
        for here, dirs, _ in os.walk(root):  # tests leave directories they made unreadable or unwritable
            for d in dirs:
                try:
                    os.chmod(os.path.join(here, d), 0o700)
                except OSError:
                    pass
        shutil.rmtree(root, ignore_errors=True)
    atexit.register(_remove_test_files)

BUILD = os.environ.get("GPUSHIM_BUILD_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "build")
BUILD = os.path.abspath(BUILD)
SHIM = os.path.join(BUILD, "lib", "libgpushim.so")
FAKECUDA = os.path.join(BUILD, "fakecuda")
BIN = os.path.join(BUILD, "bin")
REAL_GPU = os.environ.get("GPUSHIM_TEST_REAL_GPU") == "1"
# Every policy the shim offers; tests that hold for all of them loop over this list.
POLICIES = ["passthrough", "caching", "vmm"]
# Heavy stress tests multiply their counts by this (sanitizer builds in CI run them smaller).
SCALE = float(os.environ.get("GPUSHIM_TEST_SCALE") or "1")
# Sanitizer builds: what goes ahead of libgpushim.so in LD_PRELOAD (set by CMake). ASan: the runtime
# an instrumented shim needs loaded first in a program not built with it. TSan: the two Abseil
# libraries whose dynamic TLS clang-14's TSan mishandles (CMakeLists.txt says why).
PRELOAD_FIRST = os.environ.get("GPUSHIM_TEST_PRELOAD_FIRST", "")
SANITIZER = os.environ.get("GPUSHIM_TEST_SANITIZER", "")  # "", "address" or "thread"
# A program that never touches CUDA. A TSan-built shim can only be preloaded into a program that
# carries the TSan runtime itself, so TSan builds use an instrumented stand-in for /bin/true.
NO_CUDA_PROGRAM = os.path.join(BIN, "gpushim_test_true") if SANITIZER == "thread" else "/bin/true"
# What a sanitizer prints when it finds a bug; any of these in a program's stderr fails the test.
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                     "runtime error:", "ERROR: ThreadSanitizer")


def scaled(n, minimum=1):
    """`n` scaled by GPUSHIM_TEST_SCALE, never below `minimum`."""
    return max(minimum, int(n * SCALE))


def require_tool(found, tool, detail):
    """For a test that needs a tool of the machine (promtool, node, a Python with matplotlib). Where
    the suite is checked (CI: scripts/setup installs them all) a missing tool fails the test, with
    `detail`. On a GPU machine (GPUSHIM_TEST_REAL_GPU=1: an image we do not control) the test is
    reported as not run there, naming the tool, rather than as a failure of the shim."""
    if found:
        return
    if REAL_GPU:
        raise unittest.SkipTest(f"not run on this machine: {tool} missing")
    raise AssertionError(f"{tool} missing: {detail}")


def check_sanitizer_clean(stderr, what="program"):
    for marker in SANITIZER_REPORTS:
        if marker in (stderr or ""):
            raise AssertionError(f"sanitizer report from {what}:\n{stderr[-6000:]}")


class Run:
    def __init__(self, proc, report, report_path, workdir):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.report = report
        self.report_path = report_path
        self.workdir = workdir

    def shim_lines(self):
        return [l for l in self.stderr.splitlines() if l.startswith("gpushim:")]

    def device(self, ordinal=0):
        for d in self.report["devices"]:
            if d["device"] == ordinal:
                return d
        raise AssertionError(f"no device {ordinal} in report: {self.report['devices']}")

    def sites_with_function(self, name, kind="device"):
        return [s for s in self.report["sites"] if s.get("kind", "device") == kind
                and any(name in (f.get("function") or "") for f in s["frames"])]


def base_env(extra=None, preload=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHIM_") and not k.startswith("FAKECUDA_")}
    if not REAL_GPU:
        env["LD_LIBRARY_PATH"] = FAKECUDA + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    if preload:
        env["LD_PRELOAD"] = SHIM if not PRELOAD_FIRST else PRELOAD_FIRST + ":" + SHIM
    if SANITIZER == "thread":
        from pythons import stand_in_env  # the Python stand-in's interpreter (pythons.py)
        env.update(stand_in_env(required=False))  # interpreters() says when it is missing
    env.update(extra or {})
    return env


def last_json(r):
    """The last line a test program printed, which is its JSON summary."""
    return json.loads(r.stdout.strip().splitlines()[-1])


def program(name):
    return os.path.join(BIN, name)


# The settings that start threads of the shim's own (the trace's writer, live metrics and
# snapshots): their allocations have no interpreter frame on their stacks.
SHIM_THREAD_SETTINGS = ("GPUSHIM_TRACE", "GPUSHIM_METRICS", "GPUSHIM_SNAPSHOT_SIGNAL")


def interpreter_env(args, env):
    """ASan runs: `env` for `args`, with LeakSanitizer off where args[0] is a Python interpreter
    and no thread of the shim's own runs. There every allocation of the shim's has interpreter
    frames on its stack, which lsan.supp must suppress (CPython frees not all of its own at exit),
    so LSan could report nothing of ours; it cost ~0.25 s of each Python process (test_iterations
    alone: 53 -> 32 s). The shim's Python code is leak-checked in the unit tests, without an
    interpreter, and on the shim's threads in the Python runs that start them."""
    if SANITIZER != "address" or not re.fullmatch(r"python3(\.\d+)?", os.path.basename(str(args[0]))):
        return env
    if any((env or {}).get(k, "off") not in ("", "off", "0") for k in SHIM_THREAD_SETTINGS):
        return env
    env = dict(env or {})
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", os.environ.get("ASAN_OPTIONS", "")) + ":detect_leaks=0"
    return env


def run(args, env=None, preload=True, timeout=120, expect_report=True, workdir=None):
    """Runs `args` under the shim in a fresh working directory; returns a Run with the parsed report."""
    env = interpreter_env(args, env)
    if REAL_GPU and any(k.startswith("FAKECUDA_") for k in (env or {})):
        # FAKECUDA_* (capacity, fault injection) only steer the simulated device.
        raise unittest.SkipTest("needs the simulated device: " + ", ".join(k for k in env if k.startswith("FAKECUDA_")))
    workdir = workdir or tempfile.mkdtemp(prefix="gpushim-e2e-")
    report_path = os.path.join(workdir, "report.json")
    extra = {"GPUSHIM_REPORT": report_path}
    extra.update(env or {})
    with subprocess.Popen(args, env=base_env(extra, preload), cwd=workdir, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
        proc = subprocess.CompletedProcess(args, p.returncode, out, err)
        pid = p.pid
    check_sanitizer_clean(proc.stderr, args[0])
    report = None
    if expect_report:
        report_path, report = own_report(report_path, pid)
        if report is None:
            raise AssertionError(f"no report at {report_path}; rc={proc.returncode}\nstdout:\n{proc.stdout}\n"
                                 f"stderr:\n{proc.stderr}")
    return Run(proc, report, report_path, workdir)


def own_report(path, pid):
    """The report the process `pid` wrote at `path`, or (a child of it, which inherits GPUSHIM_REPORT,
    wrote there first: an existing file is never overwritten) at path with ".N" before the
    extension; (path, None) when there is none. On an H200 the IPC importer children of e2e_ipc
    wrote reports, and their parent's went to report.1.json."""
    stem, ext = os.path.splitext(path)
    found = []
    for n in range(0, 64):
        candidate = path if n == 0 else f"{stem}.{n}{ext}"
        if not os.path.exists(candidate):
            break
        with open(candidate) as f:
            report = json.load(f)
        if report.get("pid") == pid:
            return candidate, report
        found.append((candidate, report))
    # One report of another pid: the program's, written by a process it became (a launcher's
    # child). Several, none the program's: its own is missing, which no other may stand in for.
    return found[0] if len(found) == 1 else (path, None)


def start_runs(jobs, workers=4):
    """Starts run(args, env=env) for each {key: (args, env)} of `jobs`, `workers` at a time, and
    returns {key: future}. For cases that mostly wait on the simulated device's slow kernels: run one
    after another, e2e.stream_devices slept for most of its ~45 s. Each process has its own working
    directory and report. Call .result() inside the case's subTest, so that a failure (a sanitizer
    report, a missing report) lands in its own case."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    futures = {key: pool.submit(run, args, env=env) for key, (args, env) in jobs.items()}
    pool.shutdown(wait=False)
    return futures


def policies_the_shim_accepts():
    """POLICIES plus any policy still being built that this build's shim already accepts (vmm), so
    that tests looping over it pick a new policy up the day it lands."""
    out = list(POLICIES)
    for name in ("vmm",):
        if name in out:
            continue
        r = run([program("e2e_free_everything")], env={"GPUSHIM_POLICY": name, "GPUSHIM_SUMMARY": "0",
                                                      "GPUSHIM_REPORT": "off"}, expect_report=False)
        if not any(l.startswith("gpushim: GPUSHIM_POLICY=") for l in r.shim_lines()):
            out.append(name)
    return out


class ShimTestCase(unittest.TestCase):
    def assertRanOK(self, r):
        self.assertEqual(r.returncode, 0, f"program failed\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
