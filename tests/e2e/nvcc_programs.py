"""Programs compiled by nvcc (tests/e2e/nvcc/*.cu) on the simulated device, with and without the shim.

Registered by tests/e2e/CMakeLists.txt as e2e.nvcc_programs (not test_*.py: that test exists only when
GPUSHIM_NVCC_TESTS is on). nvcc's default build links NVIDIA's static runtime into the program; on the
simulated device that runtime stops at its integrity check (docs/interception.md), and these tests pin
exactly how far it gets, and that the shim's static-runtime path (dlsym -> cuGetProcAddress) carries
NVIDIA's runtime that far unharmed.
"""
import glob
import json
import os
import subprocess
import tempfile
import unittest

from shimtest import BUILD, PRELOAD_FIRST, POLICIES, REAL_GPU, ShimTestCase, base_env, check_sanitizer_clean, run

NVCC = os.environ.get("GPUSHIM_NVCC", "/usr/local/cuda/bin/nvcc")
NVCC_BIN = os.path.join(BUILD, "nvcc-bin")

# The tables NVIDIA's CUDA 13.0 static runtime asks cuGetExportTable for, in order, and what the
# simulated driver answers (tests/fakecuda/driver/export_tables.cpp).
EXPORT_TABLE_REQUESTS = [
    "fakecuda: export table f8cff95121468b4eb9e2fb469e7c0dd9: refused",
    "fakecuda: export table 6bd5fb6c5bf4e74a8987d93912fd9df9: cudart interface",
    "fakecuda: export table a094798c2e742e7493f20800200c0a66: tools runtime callback hooks",
    "fakecuda: export table 42d85a8123f6cb478298f6e78a3aecdc: tools TLS",
    "fakecuda: export table c693336e1121df11a8c368f355d89593: context-local storage",
    "fakecuda: export table 263e88607cd2614392f6bbd5006dfa7e: context checks",
    "fakecuda: export table d4082055bde6704b8d34ba123c66e1f2: integrity check (not simulated)",
    "fakecuda: integrity check for CUDA 13000: not simulated",
]
STOPS_AT = "FAILED cudaGetDeviceCount(&count): cudaErrorNotSupported (801)"


def nvcc_program(name):
    path = os.path.join(NVCC_BIN, name)
    if not os.path.exists(NVCC):
        raise AssertionError(f"{NVCC} not found: this machine's CUDA toolkit has no compiler. Install it, or "
                             "configure with -DGPUSHIM_NVCC_TESTS=OFF to leave the nvcc-built programs out.")
    if not os.path.exists(path):
        raise AssertionError(f"{path} was not built (ninja e2e_nvcc_programs)")
    return path


def run_alone(args, extra=None):
    """Runs `args` on the simulated device without the shim (ASan builds: their runtime preloaded,
    since the simulated driver is instrumented and the program is not)."""
    env = base_env(extra, preload=False)
    if PRELOAD_FIRST:
        env["LD_PRELOAD"] = PRELOAD_FIRST
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    check_sanitizer_clean(proc.stderr, args[0])
    return proc


MiB = 1 << 20


def check_kernels_report(test, r, policy):
    """kernels.cu allocates 6 blocks, frees 5 and leaks 1 MiB from leak_one_mebibyte."""
    test.assertEqual(r.report["policy"], policy)
    dev = r.device(0)
    test.assertEqual((dev["live_count"], dev["total_allocs"], dev["total_frees"], dev["failed_allocs"]),
                     (1, 6, 5, 0), dev)
    test.assertEqual(dev["live_bytes"], MiB, dev)
    sites = r.sites_with_function("leak_one_mebibyte")
    test.assertEqual(len(sites), 1, r.report["sites"])
    test.assertEqual((sites[0]["live_count"], sites[0]["live_bytes"]), (1, MiB))
    test.assertEqual(len(r.report["sites"]), 1, r.report["sites"])


class SharedRuntimeWithKernels(ShimTestCase):
    """-cudart shared: kernels registered and launched through the simulated runtime, run by stand-ins."""

    def test_runs_alone(self):
        proc = run_alone([nvcc_program("kernels_shared")])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.strip(), "OK")

    def test_runs_under_the_shim_every_policy_with_an_exact_report(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([nvcc_program("kernels_shared")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                self.assertEqual(r.stdout.strip(), "OK")
                check_kernels_report(self, r, policy)


class StaticRuntime(ShimTestCase):
    def check_stops_at_integrity_check(self, proc):
        if REAL_GPU:
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertIn("OK", proc.stdout)
            return
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.strip(), STOPS_AT)
        traced = [l for l in proc.stderr.splitlines() if l.startswith("fakecuda: ")]
        self.assertEqual(traced, EXPORT_TABLE_REQUESTS, proc.stderr)

    def test_default_nvcc_build_reaches_the_integrity_check(self):
        proc = run_alone([nvcc_program("kernels")], {"FAKECUDA_TRACE_EXPORT_TABLES": "1"})
        self.check_stops_at_integrity_check(proc)

    def test_under_the_shim_every_policy_the_same(self):
        # The runtime reaches the driver through the shim's dlsym -> cuGetProcAddress path; it never
        # allocates, so the shim never starts and writes no report (no work in processes that never
        # allocate). On a GPU the program allocates and the report must balance exactly.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([nvcc_program("kernels")], expect_report=REAL_GPU,
                        env={"GPUSHIM_POLICY": policy, "FAKECUDA_TRACE_EXPORT_TABLES": "1"})
                self.check_stops_at_integrity_check(r)
                if REAL_GPU:
                    self.assertEqual(r.report["policy"], policy)
                    self.assertEqual(r.report["sites"], [])
                    check_kernels_report(self, r, policy)
                else:
                    self.assertEqual(r.shim_lines(), [], r.stderr)
                    self.assertFalse(os.path.exists(r.report_path))

# samples.cu: mode -> (device allocations the parent makes and frees, as the shim counts them).
SAMPLES = {
    "ipc": 1,            # the shared buffer (the child only opens handles)
    "vmm": 1,            # one cuMemCreate, exported to the child
    "host-register": 1,  # the device buffer copied from (registration is no allocation)
    "pools": 6,          # three rounds of one pool and one default-pool allocation; graph memory is the graph's
}


class Samples(ShimTestCase):
    """samples.cu (-cudart shared): IPC of memory and events, VMM export to a child, host
    registration, pools and graph memory nodes, each alone and under every policy."""

    def test_alone(self):
        for mode in SAMPLES:
            with self.subTest(mode=mode):
                proc = run_alone([nvcc_program("samples_shared"), mode])
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertEqual(proc.stdout.splitlines()[-1], "OK", proc.stdout)

    def run_sample(self, mode, policy, extra=None):
        # Children run under the shim too and write their own reports: one file per pid.
        workdir = tempfile.mkdtemp(prefix="gpushim-e2e-")
        env = {"GPUSHIM_POLICY": policy, "GPUSHIM_REPORT": os.path.join(workdir, "report-%p.json")}
        env.update(extra or {})
        r = run([nvcc_program("samples_shared"), mode], env=env, expect_report=False, workdir=workdir)
        pid = r.stdout.splitlines()[0].split()[1] if r.stdout.startswith("pid ") else None
        report = os.path.join(workdir, f"report-{pid}.json")
        if os.path.exists(report):
            with open(report) as f:
                r.report = json.load(f)
        return r

    def test_under_every_policy_with_exact_counts(self):
        for policy in POLICIES:
            for mode, allocs in SAMPLES.items():
                with self.subTest(policy=policy, mode=mode):
                    # Legacy IPC cannot share cuMemMap'ed memory (a CUDA rule), which is what the vmm
                    # policy hands out; its documented way out gives IPC-sized blocks their own segment.
                    extra = {"GPUSHIM_OWN_SEGMENT_MIN": "64KiB"} if (policy, mode) == ("vmm", "ipc") else {}
                    r = self.run_sample(mode, policy, extra)
                    self.assertRanOK(r)
                    self.assertEqual(r.stdout.splitlines()[-1], "OK", r.stdout)
                    self.assertIsNotNone(r.report, r.stderr)
                    dev = r.device(0)
                    self.assertEqual((dev["total_allocs"], dev["total_frees"], dev["live_count"], dev["failed_allocs"]),
                                     (allocs, allocs, 0, 0), dev)
                    self.assertEqual(r.report["sites"], [])

    def test_vmm_policy_refuses_legacy_ipc_of_mapped_memory_and_says_why(self):
        r = self.run_sample("ipc", "vmm")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("FAILED cudaIpcGetMemHandle(&mem, d): cudaErrorInvalidValue", r.stdout)
        self.assertTrue(any("cudaIpcGetMemHandle" in l and "GPUSHIM_OWN_SEGMENT_MIN" in l for l in r.shim_lines()),
                        r.stderr)


if __name__ == "__main__":
    unittest.main()
