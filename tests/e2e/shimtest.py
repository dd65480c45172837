"""Helpers for end-to-end tests: run a real CUDA program under LD_PRELOAD=libgpushim.so and read
back what the shim wrote.

By default programs run on the simulated device (build/fakecuda). With GPUSHIM_TEST_REAL_GPU=1 they
run against NVIDIA's libcudart/libcuda instead, unchanged (the GPU validation suite does that).
"""
import json
import os
import subprocess
import tempfile
import unittest

BUILD = os.environ.get("GPUSHIM_BUILD_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "build")
BUILD = os.path.abspath(BUILD)
SHIM = os.path.join(BUILD, "lib", "libgpushim.so")
FAKECUDA = os.path.join(BUILD, "fakecuda")
BIN = os.path.join(BUILD, "bin")
REAL_GPU = os.environ.get("GPUSHIM_TEST_REAL_GPU") == "1"
# Every policy the shim offers; tests that hold for all of them loop over this list.
POLICIES = ["passthrough", "caching"]


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
        env["LD_PRELOAD"] = SHIM
    env.update(extra or {})
    return env


def program(name):
    return os.path.join(BIN, name)


def run(args, env=None, preload=True, timeout=120, expect_report=True, workdir=None):
    """Runs `args` under the shim in a fresh working directory; returns a Run with the parsed report."""
    if REAL_GPU and any(k.startswith("FAKECUDA_") for k in (env or {})):
        # FAKECUDA_* (capacity, fault injection) only steer the simulated device.
        raise unittest.SkipTest("needs the simulated device: " + ", ".join(k for k in env if k.startswith("FAKECUDA_")))
    workdir = workdir or tempfile.mkdtemp(prefix="gpushim-e2e-")
    report_path = os.path.join(workdir, "report.json")
    extra = {"GPUSHIM_REPORT": report_path}
    extra.update(env or {})
    proc = subprocess.run(args, env=base_env(extra, preload), cwd=workdir, capture_output=True, text=True,
                          timeout=timeout)
    report = None
    if expect_report:
        if not os.path.exists(report_path):
            raise AssertionError(f"no report at {report_path}; rc={proc.returncode}\nstdout:\n{proc.stdout}\n"
                                 f"stderr:\n{proc.stderr}")
        with open(report_path) as f:
            report = json.load(f)
    return Run(proc, report, report_path, workdir)


class ShimTestCase(unittest.TestCase):
    def assertRanOK(self, r):
        self.assertEqual(r.returncode, 0, f"program failed\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
