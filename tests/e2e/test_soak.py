"""Load: many threads and streams doing random allocation work with integrity checks, under every
policy: no corruption, exact accounting at every checkpoint and at the end, and the shim's own host
memory bounded by what is live (not by how long the program ran). CI runs it scaled by
GPUSHIM_TEST_SCALE; docs/reliability.md records the full 10-million-operation run."""
import json

from shimtest import ShimTestCase, policies_the_shim_accepts, program, run, scaled


def soak(policy, threads, streams, ops, seed, max_held=48, timeout=600):
    r = run([program("e2e_soak"), str(threads), str(streams), str(ops), str(seed), str(max(100, ops // 10)),
             str(max_held)],
            env={"GPUSHIM_POLICY": policy, "GPUSHIM_STACK_DEPTH": "16", "GPUSHIM_SUMMARY": "0"}, timeout=timeout)
    return r, json.loads(r.stdout.strip().splitlines()[-1])


class Soak(ShimTestCase):
    def test_detector_catches_a_late_write(self):
        r = run([program("e2e_soak"), "--self-test"], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        self.assertGreater(json.loads(r.stdout.strip().splitlines()[-1])["self_test_corruptions"], 0)

    def test_eight_threads_four_streams_every_policy(self):
        ops = scaled(10000, 300)
        for i, policy in enumerate(policies_the_shim_accepts()):
            with self.subTest(policy=policy):
                r, out = soak(policy, 8, 4, ops, 11 + i)
                self.assertRanOK(r)
                self.assertTrue(out["shim"])
                self.assertEqual(out["ops"], 8 * ops)
                self.assertEqual(out["corruptions"], 0)
                self.assertEqual(out["overlaps"], 0)
                self.assertEqual(out["accounting_mismatches"], 0)
                self.assertGreaterEqual(out["checkpoints"], 10)
                self.assertGreater(out["hazards"], 0)
                self.assertEqual(out["allocs"], out["frees"])
                dev = r.device(0)
                self.assertEqual(dev["live_count"], 0)
                self.assertEqual(dev["live_bytes"], 0)
                self.assertEqual(dev["pool"]["requested_bytes"], 0)
                self.assertEqual(dev["total_allocs"], out["allocs"])
                self.assertEqual(dev["total_frees"], out["frees"])
                self.assertEqual(dev["failed_allocs"], 0)
                self.assertEqual(r.report["invalid_frees"], 0)
                # A handful of call sites make a handful of stacks, however long the run.
                self.assertLess(r.report["distinct_stacks"], 200)
                # Bounded by what is live: a few hundred bytes per live allocation, fixed costs
                # included, except each allocating thread's stack cache tables (at most 64 KiB a
                # thread, stacks/stack_cache.h): a per-thread cost, which at the sanitizer runs'
                # smaller scale would otherwise dominate the per-allocation figure.
                per_live = (out["host_bytes_max"] - out["threads"] * 65536) / out["max_live"]
                self.assertLess(per_live, 2048, out)

    def test_host_memory_does_not_grow_with_the_length_of_the_run(self):
        # Per-allocation state only (no pool): four times the operations over the same live set
        # (4 threads x 16 blocks) leave the shim's memory where it was. A pool adds metadata for
        # what it caches (free and quarantined blocks, segments), which follows the memory it holds
        # rather than the number of operations; docs/reliability.md has the figures. Not scaled:
        # both runs must reach the steady live set.
        short_r, short = soak("passthrough", 4, 2, 1500, 5, max_held=16)
        long_r, long = soak("passthrough", 4, 2, 6000, 5, max_held=16)
        self.assertRanOK(short_r)
        self.assertRanOK(long_r)
        self.assertEqual(long["corruptions"], 0)
        # Live counts are seen at checkpoints only; both runs must be near the cap of 64.
        self.assertGreaterEqual(short["max_live"], 48, short)
        self.assertGreaterEqual(long["max_live"], 48, long)
        self.assertLess(long["host_bytes_max"], 1.5 * short["host_bytes_max"], (short, long))
        self.assertLess(long_r.report["shim_host_bytes"], 1.5 * short_r.report["shim_host_bytes"])

if __name__ == "__main__":
    import unittest
    unittest.main()
