"""GPUSHIM_FAIL: each mode fails exactly the allocations it names, the caller cannot tell an injected
failure from a real out-of-memory error, and the report marks it as injected."""
import json
import re

from shimtest import POLICIES, ShimTestCase, program, run

MiB = 1 << 20


def sequence(count, sizes, apis="m", env=None, preload=True):
    r = run([program("e2e_alloc_sequence"), str(count), ",".join(str(s) for s in sizes), apis], env=env,
            preload=preload, expect_report=preload)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return r, out


class Modes(ShimTestCase):
    def test_nth(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, out = sequence(12, [4096], "mam", {"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "nth:5,nth:11"})
                self.assertRanOK(r)
                self.assertEqual(out["failed"], [5, 11])
                self.assertEqual(out["succeeded"], 10)

    def test_an_allocation_from_a_memory_pool_is_numbered_and_failed_too(self):
        # cudaMallocFromPoolAsync (CUDA decides the device, so nothing can be asked before the call)
        # was never failed nor numbered (a review helper's hunt, 2026-11-29): it is asked once CUDA
        # made it, and freed again. Here it is the 2nd allocation, after a 200 MiB cudaMalloc.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_pool_past_cap")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "nth:2"})
                self.assertRanOK(r)
                out = json.loads(r.stdout)
                self.assertEqual((out["refused"], out["beside"]), ("cudaErrorMemoryAllocation", "cudaSuccess"), r.stderr)
                dev = r.device(0)
                self.assertEqual((dev["injected_failures"], dev["live_count"]), (1, 1), dev)
                self.assertEqual([o["injected"] for o in r.report["ooms"]], [True], r.report["ooms"])

    def test_the_summary_of_the_report_says_what_the_report_knows(self):
        # gpushim-analyze summary gave an injected failure as a real one ("Out of memory (1) at ...
        # device free 15.8 GiB"): no mark, no advice, no cached free or largest free block, all in
        # the report. A real refusal (the cap's) gets its advice and figures, and no mark.
        from test_traces import analyze, analyze_json  # pylint: disable=import-outside-toplevel
        injected = run([program("e2e_cap_and_oom"), "64", "3"], env={"GPUSHIM_FAIL": "nth:2"})
        capped = run([program("e2e_cap_and_oom"), "64", "10"], env={"GPUSHIM_LIMIT": "200MiB", "FAKECUDA_MEM": "1GiB"})
        for r, is_injected in ((injected, True), (capped, False)):
            with self.subTest(injected=is_injected):
                self.assertRanOK(r)
                oom = r.report["ooms"][0]
                self.assertEqual(oom["injected"], is_injected)
                self.assertTrue(oom["advice"])
                text = analyze("summary", r.report_path).stdout.splitlines()
                at = text.index("Out of memory (%d)" % len(r.report["ooms"]))
                mark = " (injected by GPUSHIM_FAIL)" if is_injected else ""
                self.assertRegex(text[at + 1], r"^  at [0-9.]+ s on device 0%s: requested 64\.0 MiB; allocated "
                                 r"[0-9.]+ [KMG]?i?B, reserved [0-9.]+ [KMG]?i?B \(cached free [0-9.]+ [KMG]?i?B, "
                                 r"largest free block [0-9.]+ [KMG]?i?B\), device free " % re.escape(mark), text[at + 1])
                self.assertEqual(text[at + 2], "      advice: " + oom["advice"])
                if is_injected:
                    self.assertTrue(oom["advice"].startswith("Failed on purpose by GPUSHIM_FAIL=nth:2"), oom["advice"])
                got = analyze_json("summary", r.report_path)["ooms"][0]
                for key in ("injected", "advice", "cached_free", "largest_free_block"):
                    self.assertEqual(got[key], oom[key], key)

    def test_every_nth_across_apis(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, out = sequence(30, [512, 70000, 3 * MiB], "map",
                                  {"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "every:4"})
                self.assertRanOK(r)
                self.assertEqual(out["failed"], list(range(4, 31, 4)))

    def test_random_is_reproducible_from_its_seed(self):
        runs = {}
        for policy in POLICIES:
            for seed in (5, 6):
                r, out = sequence(400, [1000], "ma",
                                  {"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": f"random:0.25,seed:{seed}"})
                self.assertRanOK(r)
                runs[(policy, seed)] = out["failed"]
        for policy in POLICIES:
            # Binomial(400, 0.25): mean 100, sd ~8.7.
            self.assertGreater(len(runs[(policy, 5)]), 50)
            self.assertLess(len(runs[(policy, 5)]), 150)
            self.assertNotEqual(runs[(policy, 5)], runs[(policy, 6)])
        # The decision depends on the seed and the allocation number only, not on the policy.
        self.assertEqual(runs[(POLICIES[0], 5)], runs[(POLICIES[-1], 5)])
        again, out = sequence(400, [1000], "ma", {"GPUSHIM_FAIL": "random:0.25,seed:5"})
        self.assertEqual(out["failed"], runs[("caching", 5)])

    def test_above_a_size(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, out = sequence(9, [MiB, MiB + 1, 64 * MiB], "mpa",
                                  {"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "above:1MiB"})
                self.assertRanOK(r)
                # cudaMallocPitch rounds its rows up to 512 B: a 1 MiB row is still exactly 1 MiB.
                self.assertEqual(out["failed"], [2, 3, 5, 6, 8, 9])


class DriverApi(ShimTestCase):
    """Device memory allocated through the driver API (cuMemAlloc_v2, cuMemAllocPitch_v2, as
    libraries with their own runtime allocate) is chosen like any other: one numbering across both
    APIs, and the failure is the driver's out-of-memory code, with no runtime last error."""

    def test_every_nth_selects_driver_allocations(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                # m d m d ...: every:2 picks exactly the cuMemAlloc_v2 calls.
                r, out = sequence(8, [4096], "md", {"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "every:2",
                                                    "GPUSHIM_SUMMARY": "0"})
                self.assertRanOK(r)
                self.assertEqual(out["failed"], [2, 4, 6, 8])
                self.assertEqual(out["errors"], ["CUresult 2"])  # CUDA_ERROR_OUT_OF_MEMORY
                self.assertTrue(out["last_error_matches"], "a driver failure must leave no runtime last error")
                dev = r.device(0)
                self.assertEqual(dev["injected_failures"], 4)
                self.assertEqual(dev["failed_allocs"], 4)
                self.assertTrue(all(o["injected"] for o in r.report["ooms"]), r.report["ooms"])
                lines = [l for l in r.shim_lines() if "injected allocation failure" in l]
                self.assertEqual(len(lines), 4, r.stderr)
                self.assertIn("allocation 2, 4.0 KiB on device 0; returned CUDA_ERROR_OUT_OF_MEMORY", lines[0])

    def test_nth_and_above_on_cu_mem_alloc_pitch(self):
        r, out = sequence(6, [4096, 8 * MiB], "q", {"GPUSHIM_FAIL": "nth:1,above:1MiB"})
        self.assertRanOK(r)
        self.assertEqual(out["failed"], [1, 2, 4, 6])
        self.assertEqual(out["errors"], ["CUresult 2"])

    def test_same_code_as_a_real_driver_oom(self):
        _, real = sequence(4, [4096], "d", {"FAKECUDA_FAIL_ALLOC": "3"}, preload=False)
        self.assertEqual(real["failed"], [3])
        r, out = sequence(4, [4096], "d", {"GPUSHIM_FAIL": "nth:3"})
        self.assertRanOK(r)
        self.assertEqual(out["failed"], [3])
        self.assertEqual(out["errors"], real["errors"])

    def test_size_zero_keeps_cudas_own_answer(self):
        # Size 0 is never an allocation GPUSHIM_FAIL counts: CUDA's CUDA_ERROR_INVALID_VALUE stays.
        _, real = sequence(2, [0], "d", preload=False)
        r, out = sequence(2, [0], "d", {"GPUSHIM_FAIL": "every:1", "GPUSHIM_SUMMARY": "0"})
        self.assertRanOK(r)
        self.assertEqual(out["errors"], real["errors"])
        self.assertEqual(out["errors"], ["CUresult 1"])
        self.assertEqual(sum(d["injected_failures"] for d in r.report["devices"]), 0)
        self.assertEqual(r.shim_lines(), [])


class LooksLikeARealOom(ShimTestCase):
    def test_same_code_and_last_error_as_a_real_oom(self):
        # A real OOM from the simulated device, without the shim.
        _, real = sequence(6, [4096], "ma", {"FAKECUDA_FAIL_ALLOC": "3"}, preload=False)
        self.assertEqual(real["failed"], [3])
        self.assertTrue(real["last_error_matches"])
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, out = sequence(6, [4096], "ma", {"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "nth:3"})
                self.assertRanOK(r)
                self.assertEqual(out["failed"], [3])
                self.assertEqual(out["errors"], real["errors"])
                self.assertEqual(out["errors"], ["cudaErrorMemoryAllocation"])
                self.assertTrue(out["last_error_matches"], "cudaGetLastError must report the injected OOM")

    def test_report_marks_injected_failures(self):
        r, out = sequence(40, [2 * MiB], "m", {"GPUSHIM_FAIL": "every:2", "GPUSHIM_SUMMARY": "0"})
        self.assertRanOK(r)
        self.assertEqual(len(out["failed"]), 20)
        dev = r.device(0)
        self.assertEqual(dev["injected_failures"], 20)
        self.assertEqual(dev["failed_allocs"], 20)
        self.assertEqual(dev["total_allocs"], 20)
        ooms = r.report["ooms"]
        self.assertEqual(len(ooms), 16, "the report keeps the first 16 OOM records")
        for o in ooms:
            self.assertTrue(o["injected"])
            self.assertEqual(o["requested"], 2 * MiB)
            self.assertIn("GPUSHIM_FAIL=every:2", o["advice"])
            self.assertTrue(any("main" in f["function"] for f in o["frames"]), o["frames"])
        lines = [l for l in r.shim_lines() if "injected allocation failure" in l]
        self.assertEqual(len(lines), 16, r.stderr)
        self.assertIn("allocation 2, 2.0 MiB on device 0", lines[0])
        self.assertIn("further injections are counted in the report only", lines[-1])
        self.assertFalse(any("out of memory on device" in l for l in r.shim_lines()))

    def test_real_oom_is_not_marked_injected(self):
        r, out = sequence(4, [4096], "m", {"FAKECUDA_FAIL_ALLOC": "1,2", "GPUSHIM_POLICY": "caching"})
        self.assertRanOK(r)
        self.assertEqual(out["failed"], [1])
        self.assertEqual(r.device(0)["injected_failures"], 0)
        self.assertFalse(r.report["ooms"][0]["injected"])

    def test_invalid_spec_disables_the_shim_with_one_line(self):
        r = run([program("e2e_alloc_sequence"), "3", "4096"], env={"GPUSHIM_FAIL": "every:0"}, expect_report=False)
        self.assertRanOK(r)
        lines = r.shim_lines()
        self.assertTrue(any(l.startswith("gpushim: GPUSHIM_FAIL='every:0' is invalid: expected") for l in lines), lines)
        self.assertEqual(json.loads(r.stdout.strip().splitlines()[-1])["failed"], [])


if __name__ == "__main__":
    import unittest
    unittest.main()
