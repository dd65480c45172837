"""numba's CUDA driver binding (Debian's python3-numba) on the simulated device, without the shim
and under it with every policy: every memory operation numba has (tests/e2e/python/numba_client.py),
IPC of a device array to a child process, and numba's flush-and-retry when an allocation runs out of
memory. The reports must count every allocation exactly. On a GPU (GPUSHIM_TEST_REAL_GPU=1) the
client reads what it holds from numba's table of live allocations rather than from the device's free
memory, which every other process on the GPU changes (the e2e modules run in parallel there)."""
import os
import subprocess
import unittest

from pythons import interpreters
from shimtest import FAKECUDA, POLICIES, PRELOAD_FIRST, REAL_GPU, SANITIZER, ShimTestCase, base_env, \
    check_sanitizer_clean, run

MiB = 1 << 20
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "numba_client.py")
# The client's "all" run: per-process figures on a GPU, the device's free memory on the simulated one.
ALL = ["all", "--per-process"] if REAL_GPU else ["all"]
# numba queues frees until it holds this many or this share of the device: the OOM test keeps them queued.
KEEP_FREES_QUEUED = {"NUMBA_CUDA_MAX_PENDING_DEALLOCS_RATIO": "1", "NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT": "100"}


def numba_python():
    """An interpreter that imports numba.cuda: scripts/setup installs Debian's python3-numba, into
    /usr/bin/python3; python3 from PATH may be another (pyenv) without it."""
    candidates = [p for p, _ in interpreters()]
    if SANITIZER != "thread":
        candidates.append("/usr/bin/python3")
    for path in dict.fromkeys(candidates):
        env = base_env(preload=False)
        if PRELOAD_FIRST:  # ASan builds: numba loads the instrumented simulated driver at import (TSan: harmless)
            env["LD_PRELOAD"] = PRELOAD_FIRST
        if os.path.exists(path) and subprocess.run([path, "-c", "import numba.cuda"], capture_output=True,
                                                   env=env).returncode == 0:
            return path
    if SANITIZER == "thread":
        # The TSan stand-in runs python3 from PATH (pythons.py); Debian's numba lives in the system
        # interpreter's dist-packages only.
        raise unittest.SkipTest("the TSan stand-in's interpreter (python3 from PATH) has no numba")
    raise AssertionError("no interpreter imports numba.cuda: run scripts/setup (python3-numba)")


def numba_env(extra=None):
    env = {} if REAL_GPU else {"NUMBA_CUDA_DRIVER": os.path.join(FAKECUDA, "libcuda.so.1")}
    env.update(extra or {})
    return env


def run_alone(args, extra):
    env = base_env(extra, preload=False)
    if PRELOAD_FIRST:  # ASan builds: the instrumented simulated driver needs the ASan runtime first
        env["LD_PRELOAD"] = PRELOAD_FIRST
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    check_sanitizer_clean(proc.stderr, args[0])
    return proc


class NumbaClient(ShimTestCase):
    @classmethod
    def setUpClass(cls):
        cls.python = numba_python()

    def test_every_memory_operation_without_the_shim(self):
        proc = run_alone([self.python, CLIENT, *ALL], numba_env())
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.splitlines()[-1], "OK", proc.stdout)

    def test_every_memory_operation_under_every_policy_with_exact_counts(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([self.python, CLIENT, *ALL], env=numba_env({"GPUSHIM_POLICY": policy}))
                self.assertRanOK(r)
                self.assertEqual(r.stdout.splitlines()[-1], "OK", r.stdout)
                dev = r.device(0)
                # Device arrays: a, b, c, d, r, shared, through_alias; all freed by numba.
                self.assertEqual((dev["total_allocs"], dev["total_frees"], dev["live_count"], dev["failed_allocs"]),
                                 (7, 7, 0, 0), dev)
                self.assertEqual(dev["live_bytes"], 0)
                self.assertGreaterEqual(dev["peak_allocated_bytes"], 3 * MiB)
                self.assertEqual(r.report["sites"], [])

    def test_out_of_memory_flush_and_retry_without_the_shim(self):
        if REAL_GPU:
            self.skipTest("needs the simulated device's FAKECUDA_MEM")
        proc = run_alone([self.python, CLIENT, "oom"], numba_env(dict(KEEP_FREES_QUEUED, FAKECUDA_MEM="64MiB")))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.splitlines()[-1], "OK", proc.stdout)

    def test_out_of_memory_flush_and_retry_under_a_limit_every_policy(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([self.python, CLIENT, "oom"],
                        env=numba_env(dict(KEEP_FREES_QUEUED, GPUSHIM_POLICY=policy, GPUSHIM_LIMIT="64MiB")))
                self.assertRanOK(r)
                self.assertEqual(r.stdout.splitlines()[-1], "OK", r.stdout)
                dev = r.device(0)
                # Three 16 MiB arrays, one 32 MiB refused under the limit, then granted after numba's flush.
                self.assertEqual((dev["total_allocs"], dev["total_frees"], dev["failed_allocs"], dev["live_count"]),
                                 (4, 4, 1, 0), dev)
                self.assertEqual(dev["peak_allocated_bytes"], 48 * MiB, dev)
                self.assertTrue(any("out of memory" in l and "requested 32.0 MiB" in l for l in r.shim_lines()),
                                r.stderr)


if __name__ == "__main__":
    unittest.main()
