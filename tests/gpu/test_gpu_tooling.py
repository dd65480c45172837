"""What of the GPU validation suite can be checked without a GPU: the relocatable bundle works under
LD_PRELOAD (on the simulated device), scripts/gpu-validate skips cleanly and says why, and the kernel
library built with nvcc has the contract the e2e programs rely on."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("GPUSHIM_BUILD_DIR") or os.path.join(ROOT, "build"))
MiB = 1 << 20


def sanitizer_build():
    """GPUSHIM_SANITIZE of the build tree ("" for a normal build)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("GPUSHIM_SANITIZE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUSHIM_", "FAKECUDA_")) and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(extra)
    return env


@unittest.skipIf(sanitizer_build(), "bundles are made from release builds, not sanitizer builds")
class Bundle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gpushim-bundle-test-")
        built = os.path.join(cls.tmp, "built")
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bundle"), "--no-build", "--build-dir", BUILD,
                        "--out", built], check=True, capture_output=True, text=True)
        # Relocatable means it works wherever it is copied: use it from another path than the built one.
        cls.bundle = os.path.join(cls.tmp, "elsewhere", "gpushim")
        os.makedirs(os.path.dirname(cls.bundle))
        shutil.move(built, cls.bundle)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_bundled_library_has_runpath_origin(self):
        libs = sorted(os.listdir(os.path.join(self.bundle, "lib")))
        self.assertIn("libgpushim.so", libs)
        self.assertTrue(any(l.startswith("libabsl_") for l in libs), libs)
        for lib in libs:
            out = subprocess.run(["readelf", "-d", os.path.join(self.bundle, "lib", lib)], capture_output=True,
                                 text=True, check=True).stdout
            self.assertRegex(out, r"\(RUNPATH\)\s+Library runpath: \[\$ORIGIN\]", lib)

    def test_non_system_dependencies_resolve_inside_the_bundle(self):
        out = subprocess.run(["ldd", os.path.join(self.bundle, "lib", "libgpushim.so")], capture_output=True,
                             text=True, check=True, env=clean_env()).stdout
        deps = dict(re.findall(r"^\s*(\S+) => (\S+)", out, re.M))
        absl = {k: v for k, v in deps.items() if k.startswith("libabsl_")}
        self.assertTrue(absl, out)
        for soname, path in absl.items():
            self.assertEqual(path, os.path.join(self.bundle, "lib", soname))

    def test_e2e_program_under_the_bundled_preload(self):
        report = os.path.join(self.tmp, "report.json")
        env = clean_env(LD_PRELOAD=os.path.join(self.bundle, "lib", "libgpushim.so"),
                        LD_LIBRARY_PATH=os.path.join(self.bundle, "fakecuda"), GPUSHIM_REPORT=report, LD_DEBUG="libs")
        proc = subprocess.run([os.path.join(self.bundle, "bin", "e2e_leak_two_sites")], env=env, capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        # The unwinder and the DWARF reader the shim dlopens come from the bundle, not the system.
        for lib in ("libunwind.so.8", "libdw.so.1", "libabsl_hash.so.20220623"):
            self.assertIn(f"calling init: {os.path.join(self.bundle, 'lib', lib)}", proc.stderr)
        with open(report) as f:
            rep = json.load(f)
        self.assertEqual(rep["devices"][0]["live_count"], 5)
        frames = [f for s in rep["sites"] for f in s["frames"] if "leak_from_alpha" in (f.get("function") or "")]
        self.assertTrue(frames, json.dumps(rep["sites"])[:2000])
        self.assertTrue(frames[0]["file"].endswith("leak_two_sites.cpp"))  # file:line through bundled libdw
        self.assertGreater(frames[0]["line"], 0)

    def test_e2e_helpers_run_from_the_bundle(self):
        env = clean_env(GPUSHIM_BUILD_DIR=self.bundle)
        proc = subprocess.run([sys.executable, "-m", "unittest", "test_foundation.LeakingProgram",
                               "test_foundation.Exports"], cwd=os.path.join(self.bundle, "tests", "e2e"), env=env,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertRegex(proc.stderr, r"Ran [1-9]\d* tests?")

    def test_manifest_says_what_the_target_needs(self):
        with open(os.path.join(self.bundle, "MANIFEST.json")) as f:
            m = json.load(f)
        self.assertEqual(m["kind"], "gpushim-bundle")
        self.assertRegex(m["requires"]["GLIBC"], r"^2\.\d+$")
        self.assertIn("libgpushim.so", m["libraries"])
        self.assertIn("e2e_reuse_integrity", m["programs"])
        self.assertIn("gpushim_bench_alloc", m["programs"])

    def test_gpu_validate_from_the_bundle_says_so_and_skips_without_a_gpu(self):
        proc = subprocess.run([sys.executable, os.path.join(self.bundle, "scripts", "gpu-validate")],
                              env=clean_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 77, proc.stdout + proc.stderr)
        self.assertIn(f"running from the bundle {self.bundle}", proc.stderr)
        self.assertRegex(proc.stdout, r"^SKIPPED: gpu-validate needs an NVIDIA GPU: .+\. Nothing was run\.")


class GpuValidateWithoutGpu(unittest.TestCase):
    def run_validate(self, **env):
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu-validate"), "--build-dir", BUILD,
                               "--no-build"], env=clean_env(**env), capture_output=True, text=True, timeout=120)

    def test_no_visible_gpu_is_a_clean_skip(self):
        proc = self.run_validate(CUDA_VISIBLE_DEVICES="")
        self.assertEqual(proc.returncode, 77, proc.stdout + proc.stderr)
        self.assertIn(f"running from the source tree {ROOT}, build {BUILD}", proc.stderr)
        self.assertRegex(proc.stdout, r"^SKIPPED: gpu-validate needs an NVIDIA GPU: ")
        self.assertNotIn("Traceback", proc.stderr)

    @unittest.skipIf(sanitizer_build(), "the simulated driver of a sanitizer build needs the sanitizer runtime, "
                                        "which this Python process does not carry")
    def test_simulated_driver_is_not_taken_for_a_gpu(self):
        proc = self.run_validate(LD_LIBRARY_PATH=os.path.join(BUILD, "fakecuda"))
        self.assertEqual(proc.returncode, 77, proc.stdout + proc.stderr)
        self.assertIn("is the simulated device, not NVIDIA's driver", proc.stdout)


@unittest.skipIf(sanitizer_build(), "an instrumented shim cannot be preloaded into the uninstrumented bench programs")
class GpuValidateOnTheSimulatedDevice(unittest.TestCase):
    """--simulated lets the simulated device stand in for a GPU: it exercises the script's own
    logic (running the parts, reading their results, the table), not gpushim on a GPU."""

    def test_one_table_with_every_part_and_every_policy(self):
        policies = subprocess.run([os.path.join(BUILD, "bin", "gpushim_bench_policies")], capture_output=True,
                                  text=True, check=True).stdout.split()
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu-validate"), "--build-dir", BUILD,
                               "--no-build", "--simulated", "--quick", "--parts", "e2e,micro",
                               "--e2e-modules", "test_foundation.Exports,test_foundation.Quiet"],
                              env=clean_env(), capture_output=True, text=True, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr[-3000:])
        out = proc.stdout
        self.assertIn("--simulated: the simulated device stood in for a GPU", out)
        table = [l for l in out.splitlines() if l.startswith("| ")]
        self.assertTrue(table[0].startswith("| part | workload | configuration |"), table[:1])
        e2e = [l for l in table if l.startswith("| e2e |")]
        self.assertEqual(len(e2e), 1, table)
        self.assertRegex(e2e[0], r"\| 3 passed, 0 failed, 0 skipped \|")
        micro = [l for l in table if l.startswith("| micro |")]
        for config in ["raw CUDA (no shim)"] + [f"{p}, stacks 32" for p in policies]:
            rows = [l for l in micro if f"| {config} |" in l]
            self.assertEqual(len(rows), 6, (config, micro))  # 2 APIs x 3 sizes
            for r in rows:
                self.assertRegex(r, r"\| \d+(\.\d)? (ns|µs|ms) / \d+(\.\d)? (ns|µs|ms) per pair \|")


def load_gpu_validate():
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("gpu_validate", os.path.join(ROOT, "scripts", "gpu-validate"))
    spec = importlib.util.spec_from_loader("gpu_validate", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class Verdicts(unittest.TestCase):
    """How gpu-validate reads a PyTorch run and the shim's report (the parts a GPU run would need)."""

    @classmethod
    def setUpClass(cls):
        cls.gv = load_gpu_validate()

    LEAK = {"leaked_bytes": 60 * 4 * MiB, "leaked_count": 60, "leak_function": "keep_for_later"}

    def site(self, count, nbytes, functions):
        return {"live_count": count, "live_bytes": nbytes, "frames": [{"function": f} for f in functions]}

    def test_losses_identical_or_how_far_apart(self):
        self.assertEqual(self.gv.compare_losses([1.5, 2.25], [1.5, 2.25]), "identical")
        self.assertEqual(self.gv.compare_losses([1.5, 2.0], [1.5, 2.25]), "differs: max |Δ| 0.25")
        self.assertIn("different length", self.gv.compare_losses([1.0], [1.0, 2.0]))

    def test_leak_found_through_the_growth_section(self):
        rep = {"growth": {"suspects": [
            {"bytes_per_iteration": 0, "bytes_per_s": 10.0, "frames": [{"function": "load_model"}]},
            {"bytes_per_iteration": 4194304.0, "frames": [{"function": "keep_for_later"}, {"function": "step"}]}]},
            "sites": []}
        found, how = self.gv.leak_verdict(rep, self.LEAK)
        self.assertTrue(found)
        self.assertIn("growth suspect #2 is keep_for_later()", how)

    def test_growth_section_that_misses_it_is_a_miss_even_if_live_at_exit(self):
        rep = {"growth": {"suspects": []}, "sites": [self.site(60, 60 * 4 * MiB, ["?"])]}
        found, how = self.gv.leak_verdict(rep, self.LEAK)
        self.assertFalse(found)
        self.assertIn("does not name keep_for_later()", how)

    def test_without_growth_section_a_site_holding_the_leak_at_exit(self):
        rep = {"sites": [self.site(3, 300 * MiB, ["load"]), self.site(60, 60 * 4 * MiB, ["clone", "keep_for_later"])]}
        found, how = self.gv.leak_verdict(rep, self.LEAK)
        self.assertTrue(found)
        self.assertIn("site with 60 live blocks, 240 MiB at exit, frames name keep_for_later()", how)
        found, how = self.gv.leak_verdict({"sites": [self.site(59, 60 * 4 * MiB, [])]}, self.LEAK)
        self.assertFalse(found)
        self.assertFalse(self.gv.leak_verdict(None, self.LEAK)[0])

    def test_nccl_and_cublas_from_the_modules_section(self):
        rep = {"modules": [{"module": "/venv/lib/libnccl.so.2", "peak_bytes": 96 * MiB, "live_bytes": 32 * MiB},
                           {"module": "/venv/lib/libtorch_cuda.so", "peak_bytes": 5 * MiB, "live_bytes": 0},
                           {"module": "/venv/lib/libcublasLt.so.13", "peak_bytes": 8 * MiB, "live_bytes": 8 * MiB}]}
        self.assertEqual(self.gv.module_view(rep), "NCCL/cuBLAS: libnccl.so.2 peak 96 MiB (live at exit 32 MiB), "
                                                   "libcublasLt.so.13 peak 8 MiB (live at exit 8 MiB)")
        self.assertEqual(self.gv.module_view({"modules": []}), "NCCL/cuBLAS: none seen")
        self.assertIn("n/a", self.gv.module_view({}))


@unittest.skipIf(sanitizer_build(), "the GPU suite runs release builds; sanitizer builds do not build the benchmarks")
class NvidiaRuntimeLinkage(unittest.TestCase):
    """The programs the GPU suite runs are the ones built here, linked to the simulated libcudart: on a
    GPU they must bind to NVIDIA's libcudart.so.13 unchanged. Where NVIDIA's runtime is installed (the
    toolkit is, on the build machines), check that every symbol and symbol version resolves."""

    def test_programs_and_kernels_resolve_against_nvidias_libcudart(self):
        cudart = load_gpu_validate().find_cudart_dir()
        if cudart is None:
            self.skipTest("NVIDIA's libcudart.so.13 is not installed here")
        import glob
        binaries = sorted(glob.glob(os.path.join(BUILD, "bin", "e2e_*")))
        binaries += [os.path.join(BUILD, "bin", f"gpushim_bench_{n}") for n in ("alloc", "fragmentation", "host_memory")]
        kernels = os.path.join(BUILD, "gpu", "libgpushim_testkernels.so")
        if os.path.exists(kernels):
            binaries.append(kernels)
        self.assertGreater(len(binaries), 5)
        for b in binaries:
            out = subprocess.run(["ldd", "-r", b], env=clean_env(LD_LIBRARY_PATH=cudart), capture_output=True,
                                 text=True).stdout + "\n"
            with self.subTest(binary=os.path.basename(b)):
                self.assertIn(f"libcudart.so.13 => {os.path.join(cudart, 'libcudart.so.13')}", out)
                self.assertNotRegex(out, r"undefined symbol|not found")


class TestKernels(unittest.TestCase):
    def test_delayed_fill_library_has_the_contract_of_the_simulated_one(self):
        lib = os.path.join(BUILD, "gpu", "libgpushim_testkernels.so")
        if not os.path.exists(lib):
            self.skipTest("nvcc was not found at configure time, so the kernel library was not built")
        syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
        self.assertRegex(syms, r"\bT fakecudaLaunchDelayedFill\b")
        dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
        # It must share the program's libcudart (streams are the program's), not carry its own.
        self.assertIn("[libcudart.so.13]", dyn)


if __name__ == "__main__":
    unittest.main()
