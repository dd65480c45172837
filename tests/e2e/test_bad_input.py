"""Bad input: CUDA calls with bad arguments get exactly what CUDA gives them, under every policy;
bad configuration never stops the job."""
import json

from shimtest import ShimTestCase, policies_the_shim_accepts, program, run


def answers(env=None, preload=True):
    r = run([program("e2e_bad_arguments")], env=dict({"FAKECUDA_DEVICES": "2"}, **(env or {})), preload=preload,
            expect_report=preload)
    return r, json.loads(r.stdout.strip().splitlines()[-1])


class BadArguments(ShimTestCase):
    def test_same_answers_as_cuda_under_every_policy(self):
        base_run, base = answers(preload=False)
        self.assertRanOK(base_run)
        self.assertEqual(base["devices"], 2)
        self.assertTrue(base["intact"])
        for policy in policies_the_shim_accepts():
            for extra in ({}, {"GPUSHIM_LIMIT": "512MiB"}):
                with self.subTest(policy=policy, **extra):
                    r, got = answers(dict({"GPUSHIM_POLICY": policy}, **extra))
                    self.assertRanOK(r)
                    self.assertTrue(got["intact"], "a bad call must not harm live data")
                    diff = {k: (base[k], got.get(k)) for k in base if base[k] != got.get(k)}
                    self.assertEqual(diff, {}, "CUDA's answer vs the shim's")

    def test_failure_accounting_is_the_same_under_every_policy(self):
        # Calls CUDA refuses for their arguments are no failed allocations; what could not get
        # memory is, whichever policy served or forwarded it (overflowing pitch shapes included).
        seen = {}
        for policy in policies_the_shim_accepts():
            r, _ = answers({"GPUSHIM_POLICY": policy})
            self.assertRanOK(r)
            seen[policy] = {d["device"]: (d["failed_allocs"], d["pool"]["ooms"]) for d in r.report["devices"]}
        self.assertEqual(len({json.dumps(v, sort_keys=True) for v in seen.values()}), 1, seen)
        failed, ooms = seen["passthrough"][0]
        self.assertGreaterEqual(failed, ooms)
        self.assertGreater(ooms, 0)

    def test_gpushim_fail_never_turns_an_argument_error_into_out_of_memory(self):
        # An impossible pitch shape (a row that cannot be rounded, a size past 2^64) is refused for
        # its arguments; GPUSHIM_FAIL picked it first and answered out of memory (a review helper's
        # hunt, 2026-11-29). Every call CUDA refuses as invalid keeps that answer.
        _, base = answers(preload=False)
        invalid = {k: v for k, v in base.items()
                   if isinstance(v, str) and (v.startswith("cudaErrorInvalidValue") or v.startswith("CUresult 1"))}
        self.assertIn("pitch_width_size_max", invalid)
        for policy in policies_the_shim_accepts():
            with self.subTest(policy=policy):
                r, got = answers({"GPUSHIM_POLICY": policy, "GPUSHIM_FAIL": "above:1GiB"})
                self.assertRanOK(r)
                self.assertEqual({k: got.get(k) for k in invalid}, invalid)
                self.assertGreater(r.device(0)["injected_failures"], 0)  # it did fail the large requests

    def test_the_list_covers_what_the_issue_names(self):
        _, base = answers(preload=False)
        for key in ("malloc_null_out", "malloc_zero", "malloc_size_max", "malloc_async_zero", "pitch_null_out",
                    "free_host_heap", "free_other_device", "free_second"):
            self.assertIn(key, base)
        self.assertTrue(base["malloc_size_max"].startswith("cudaErrorMemoryAllocation/cudaErrorMemoryAllocation"))
        self.assertTrue(base["free_other_device"].startswith("cudaSuccess/"), base["free_other_device"])

    def test_driver_calls_get_what_cuda_documents(self):
        # The answers every policy is compared with above are the simulated driver's; here those that
        # CUDA documents for the driver API are held to it (the same checks run on a GPU): NULL out
        # pointers, size 0 and frees of host pointers are CUDA_ERROR_INVALID_VALUE. cuMemFree(0) is a
        # no-op, as cudaFree(nullptr): an H200 answered CUDA_SUCCESS wherever no capture forbade it
        # (tests/gpu/capture_queries_h200.jsonl; this module's own run there needs FAKECUDA_DEVICES).
        _, base = answers(preload=False)
        invalid, oom, ok = "CUresult 1", "CUresult 2", "CUresult 0"  # CUDA_ERROR_INVALID_VALUE, ..._OUT_OF_MEMORY
        expected = {
            "cu_alloc_null_out": invalid,
            "cu_alloc_zero": invalid,
            "cu_alloc_size_max": oom,
            "cu_free_zero": ok,
            "cu_free_host_heap": invalid,  # a host pointer to cuMemFree
            "cu_free_host_of_device_ptr": invalid,
            "cu_free_host_of_heap": invalid,  # memory cuMemAllocHost did not give
            "cu_pitch_null_pitch": invalid,  # NULL pitch out pointer
            "cu_free_first": ok,
            "cu_free_second": invalid,
            "cu_free_of_pinned_host": invalid,  # pinned host memory to cuMemFree
            "cu_free_host_of_pinned": ok,
        }
        self.assertEqual({k: base.get(k) for k in expected}, expected)


if __name__ == "__main__":
    import unittest
    unittest.main()
