"""The bundle (scripts/bundle) runs wherever it is copied, and scripts/gpu-validate runs from it within
its budget and keeps what it measured: the bundle is built once, moved to another folder, and used
from there on the simulated device."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

from tooling_env import ROOT, BUILD, clean_env, sanitizer_build

# What the target machine provides: the C/C++ runtime and NVIDIA's driver and runtime.
SYSTEM = re.compile(r"^(linux-vdso|ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so")
NVIDIA = re.compile(r"^(libcuda|libcudart)\.so")
# Quick e2e modules for the bundle's check: native programs (file:line through the bundled libdw), the
# helper libraries of e2e-libs/, a Python client of tests/e2e/python with gpushim-analyze.
# test_files.Fallback stages a copy of a program outside the bundle (as root: for an unprivileged user).
E2E_MODULES = ["test_foundation.LeakingProgram", "test_foundation.Exports", "test_every_allocation.Dlsym",
               "test_user_line", "test_files.Fallback"]
# What scripts/setup installs for the e2e tests, which the bundle carries for machines without it.
PROMTOOL = os.environ.get("GPUSHIM_PROMTOOL", "/usr/local/lib/gpushim-tools/promtool")
SPEEDSCOPE = os.environ.get("GPUSHIM_SPEEDSCOPE", "/usr/local/lib/gpushim-node/node_modules/speedscope")


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


TMP = BUNDLE = None


def setUpModule():
    global TMP, BUNDLE
    if sanitizer_build():
        raise unittest.SkipTest("bundles are made from release builds, not sanitizer builds")
    TMP = tempfile.mkdtemp(prefix="gpushim-bundle-test-")
    built = os.path.join(TMP, "built")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bundle"), "--no-build", "--strip",
                           "--build-dir", BUILD, "--out", built], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("scripts/bundle failed:\n" + proc.stderr[-3000:])
    # Relocatable means it works wherever it is copied: use it from another path than the built one.
    BUNDLE = os.path.join(TMP, "elsewhere", "gpushim")
    os.makedirs(os.path.dirname(BUNDLE))
    shutil.move(built, BUNDLE)


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


class Bundle(unittest.TestCase):
    def elves(self):
        return [os.path.join(dp, f) for dp, _, fs in os.walk(BUNDLE) for f in fs
                if not os.path.islink(os.path.join(dp, f)) and is_elf(os.path.join(dp, f))]

    def test_the_suite_is_all_there(self):
        for path in ("bin/gpushim", "bin/gpushim-analyze", "bin/gpushim_bench_alloc", "bin/e2e_reuse_integrity",
                     "bin/libe2e_native_helpers.so", "scripts/gpushim", "scripts/gpu-validate", "scripts/gpu-run-device",
                     "tests/gpu/train.py", "tests/gpu/shim_stats.py", "tests/gpu/run_e2e.py",
                     "tests/gpu/validate_support.py",
                     "tests/e2e/shimtest.py", "tests/e2e/python/cuda_ctypes.py", "tests/e2e/scripts/ctypes_cudart.py",
                     "e2e-libs/libe2e_next_a.so", "stand-ins/python3", "fakecuda/libcudart.so.13", "README.md"):
            self.assertTrue(os.path.exists(os.path.join(BUNDLE, path)), path)
        self.assertTrue(any(l.startswith("libbenchmark") for l in os.listdir(os.path.join(BUNDLE, "lib"))))

    def test_the_tools_installed_here_travel_with_it_and_gpu_validate_hands_them_to_the_tests(self):
        import importlib.machinery
        import importlib.util
        loader = importlib.machinery.SourceFileLoader("bundled_gpu_validate", os.path.join(BUNDLE, "scripts", "gpu-validate"))
        spec = importlib.util.spec_from_loader("bundled_gpu_validate", loader)
        gv = importlib.util.module_from_spec(spec)
        loader.exec_module(gv)
        work = tempfile.mkdtemp(dir=TMP)
        env = gv.e2e_tools_env(work)
        # gpushim-plot tries the Python running gpu-validate (PyTorch's, on the device) first.
        self.assertEqual(env["GPUSHIM_PYTHON"], sys.executable)
        if os.access(PROMTOOL, os.X_OK):
            self.assertTrue(os.path.exists(os.path.join(BUNDLE, "tools", "promtool.gz")))
            self.assertEqual(os.path.dirname(env["GPUSHIM_PROMTOOL"]), work)
            proc = subprocess.run([env["GPUSHIM_PROMTOOL"], "--version"], capture_output=True, text=True,
                                  env=clean_env(), timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("promtool", proc.stdout + proc.stderr)
        else:
            self.assertNotIn("GPUSHIM_PROMTOOL", env)
        if os.path.isdir(os.path.join(SPEEDSCOPE, "dist", "release")):
            self.assertEqual(env["GPUSHIM_SPEEDSCOPE"], os.path.join(BUNDLE, "tools", "speedscope"))
            self.assertEqual(sorted(os.listdir(os.path.join(env["GPUSHIM_SPEEDSCOPE"], "dist", "release"))),
                             sorted(os.listdir(os.path.join(SPEEDSCOPE, "dist", "release"))))
        else:
            self.assertNotIn("GPUSHIM_SPEEDSCOPE", env)

    def test_every_elf_file_has_an_origin_relative_runpath(self):
        elves = self.elves()
        self.assertGreater(len(elves), 40)
        for e in elves:
            out = subprocess.run(["readelf", "-d", e], capture_output=True, text=True, check=True).stdout
            m = re.search(r"\(RUNPATH\)\s+Library runpath: \[([^\]]*)\]", out)
            self.assertTrue(m, f"{e} has no RUNPATH")
            self.assertTrue(all(p.startswith("$ORIGIN") for p in m.group(1).split(":")), (e, m.group(1)))

    def test_ldd_under_an_empty_environment_resolves_everything_inside_the_bundle(self):
        for e in self.elves():
            if "/fakecuda/" in e:
                continue
            out = subprocess.run(["/usr/bin/env", "-i", "/usr/bin/ldd", e], capture_output=True, text=True).stdout
            with self.subTest(elf=os.path.relpath(e, BUNDLE)):
                for soname, where in re.findall(r"^\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$", out, re.M):
                    if where == "not found":
                        self.assertRegex(soname, NVIDIA, out)  # the target's driver and runtime
                    elif not SYSTEM.match(soname) and not NVIDIA.match(soname):
                        self.assertTrue(where.startswith(BUNDLE + "/"), (soname, where))

    def test_launcher_runs_from_the_bundle(self):
        report = os.path.join(TMP, "launcher-report.json")
        proc = subprocess.run([os.path.join(BUNDLE, "bin", "gpushim"), "run", "--policy", "caching", "--report", report,
                               "--", os.path.join(BUNDLE, "bin", "e2e_leak_two_sites")],
                              env=clean_env(LD_LIBRARY_PATH=os.path.join(BUNDLE, "fakecuda")), capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        # The analyzer beside it loads (Abseil through its RUNPATH) and checked the options.
        self.assertNotIn("no gpushim-analyze", proc.stderr)
        with open(report) as f:
            rep = json.load(f)
        self.assertEqual(rep["devices"][0]["live_count"], 5)
        frames = [f for s in rep["sites"] for f in s["frames"] if "leak_from_alpha" in (f.get("function") or "")]
        self.assertTrue(frames and frames[0]["file"].endswith("leak_two_sites.cpp"), json.dumps(rep["sites"])[:2000])

    def test_the_stripped_library_still_names_its_version(self):
        # The launcher reads the tag from the library (util/version.h); a stripped copy lost it
        # once (the linker's --gc-sections dropped the unreferenced tag).
        proc = subprocess.run([os.path.join(BUNDLE, "bin", "gpushim"), "--version"], env=clean_env(),
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stdout, r"^gpushim \d+\.\d+\.\d+ \(")

    def test_e2e_modules_run_from_the_bundle(self):
        proc = subprocess.run([sys.executable, "-m", "unittest", *E2E_MODULES], cwd=os.path.join(BUNDLE, "tests", "e2e"),
                              env=clean_env(GPUSHIM_BUILD_DIR=BUNDLE), capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertRegex(proc.stderr, r"Ran [1-9]\d* tests?")
        self.assertNotRegex(proc.stderr, r"skipped=")

    def test_manifest_says_what_the_target_needs(self):
        with open(os.path.join(BUNDLE, "MANIFEST.json")) as f:
            m = json.load(f)
        self.assertEqual(m["kind"], "gpushim-bundle")
        self.assertRegex(m["requires"]["GLIBC"], r"^2\.\d+$")
        self.assertIn("libgpushim.so", m["libraries"])
        self.assertIn("e2e_reuse_integrity", m["programs"])
        self.assertIn("gpushim_bench_alloc", m["programs"])

    def test_gpu_validate_from_the_bundle_says_so_and_skips_without_a_gpu(self):
        proc = subprocess.run([sys.executable, os.path.join(BUNDLE, "scripts", "gpu-validate")],
                              env=clean_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 77, proc.stdout + proc.stderr)
        self.assertIn(f"running from the bundle {BUNDLE}", proc.stderr)
        self.assertRegex(proc.stdout, r"^SKIPPED: gpu-validate needs an NVIDIA GPU: .+\. Nothing was run\.")


def read_results(out):
    with open(os.path.join(out, "results.jsonl")) as f:
        text = f.read()
    if text:
        assert text.endswith("\n"), "a line of results.jsonl was cut"
    return [json.loads(l) for l in text.splitlines()]


class GpuValidateFromTheBundle(unittest.TestCase):
    """--simulated: the simulated device stands in for a GPU, to check the script (plan, parts, files)."""

    def validate(self, out, *args):
        return [sys.executable, os.path.join(BUNDLE, "scripts", "gpu-validate"), "--simulated", "--out", out,
                "--jobs", "2", *args]

    def test_within_its_budget_with_every_result_in_the_folder(self):
        out = os.path.join(TMP, "run-whole")
        budget = 60
        t0 = time.monotonic()
        # test_live.StrictParser runs promtool: the bundle's, unpacked by gpu-validate.
        proc = subprocess.run(self.validate(out, "--budget", str(budget), "--parts", "micro,steptime,e2e",
                                            "--e2e-modules", "test_foundation.Exports,test_foundation.Quiet,"
                                                             "test_live.StrictParser"),
                              env=clean_env(), capture_output=True, text=True, timeout=budget + 30)
        took = time.monotonic() - t0
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        self.assertLess(took, budget)
        records = read_results(out)
        micro = [r for r in records if r["part"] == "micro"]
        for config in ("no shim", "caching", "vmm"):
            rows = [r for r in micro if r["config"] == config and r["name"].startswith("cuda")]
            self.assertEqual(len(rows), 6, (config, micro))  # 2 APIs x 3 sizes
            for r in rows:
                self.assertEqual(r["status"], "pass", r)
                self.assertRegex(r["result"], r"^\d+(\.\d)? (ns|µs|ms) / \d+(\.\d)? (ns|µs|ms) per pair")
        reuse = [r for r in micro if r["name"].startswith("e2e_reuse_integrity")]
        self.assertEqual(sorted((r["config"], r["name"], r["status"]) for r in reuse),
                         [(p, f"e2e_reuse_integrity {a}", "pass") for p in ("caching", "vmm") for a in ("2 10 2", "4 10 1")])
        e2e = {r["name"]: r for r in records if r["part"] == "e2e"}
        self.assertEqual(sorted(e2e), ["test_foundation.Exports", "test_foundation.Quiet", "test_live.StrictParser"])
        self.assertTrue(all(r["status"] == "pass" and r["counts"]["ok"] >= 1 for r in e2e.values()), e2e)
        self.assertEqual(e2e["test_live.StrictParser"]["counts"], {"ok": 3, "fail": 0, "error": 0, "skipped": 0})
        # The part it cannot run is reported as skipped, with the reason, not left out.
        step = [r for r in records if r["part"] == "steptime"]
        self.assertEqual([(r["status"], r["message"]) for r in step],
                         [("skipped", "--simulated: PyTorch needs a real GPU")])
        with open(os.path.join(out, "table.md")) as f:
            table = f.read()
        self.assertIn(f"Budget {budget} s. Plan: micro (~15 s), e2e (~20 s); ~45 s in all. Skipped: steptime", table)
        self.assertIn("Skipped: steptime (--simulated: PyTorch needs a real GPU)", table)
        self.assertEqual(table.count("\n| micro |"), len(micro))
        with tarfile.open(os.path.join(out, "traces.tar.gz")) as t:
            names = t.getnames()
        self.assertIn("reuse-vmm-4_10_1.trace", names)
        self.assertIn("reuse-caching-2_10_2.report.json", names)

    def test_a_run_stopped_halfway_keeps_the_finished_results(self):
        out = os.path.join(TMP, "run-killed")
        log_path = os.path.join(TMP, "run-killed.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(self.validate(out, "--budget", "120", "--parts", "micro,e2e",
                                                  "--e2e-modules", "test_foundation.Exports"),
                                    env=clean_env(), stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 60
            seen = []
            while time.monotonic() < deadline and proc.poll() is None:
                if os.path.exists(os.path.join(out, "results.jsonl")):
                    seen = read_results(out)
                    if any(r["name"].startswith("e2e_reuse_integrity") for r in seen):
                        break
                time.sleep(0.05)
            self.assertIsNone(proc.poll(), "it ended before it could be stopped halfway")
            proc.send_signal(signal.SIGTERM)   # what `timeout` sends at the end of a device's time
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        with open(log_path) as f:
            self.assertEqual(proc.returncode, 143, f.read()[-3000:])
        records = read_results(out)
        self.assertGreaterEqual(len(records), len(seen))
        self.assertGreaterEqual(len([r for r in records if r["part"] == "micro"]), 18)
        self.assertFalse([r for r in records if r["part"] == "e2e"], "the e2e part had not started")
        with open(os.path.join(out, "table.md")) as f:
            table = f.read()
        for r in records:
            self.assertIn(f"| {r['part']} | {r['name']} | {r['config']} | {r['status']} |", table)


if __name__ == "__main__":
    unittest.main()
