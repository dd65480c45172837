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

    def test_the_list_covers_what_the_issue_names(self):
        _, base = answers(preload=False)
        for key in ("malloc_null_out", "malloc_zero", "malloc_size_max", "malloc_async_zero", "pitch_null_out",
                    "free_host_heap", "free_other_device", "free_second"):
            self.assertIn(key, base)
        self.assertTrue(base["malloc_size_max"].startswith("cudaErrorMemoryAllocation/cudaErrorMemoryAllocation"))
        self.assertTrue(base["free_other_device"].startswith("cudaSuccess/"), base["free_other_device"])


if __name__ == "__main__":
    import unittest
    unittest.main()
