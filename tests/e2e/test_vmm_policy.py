"""End-to-end tests of GPUSHIM_POLICY=vmm through the real hooks: data written with cudaMemcpy
survives when the pool remaps free memory into one range (stitching) and when it grows a free
block in place, and the report shows that the remapping actually happened. The unit tests
(tests/unit/vmm_pool_test.cpp) check the pool's bookkeeping over a simulated backend with no data;
here every byte goes through the simulated device's memory (memfds mapped with cuMemMap)."""
import unittest

from shimtest import POLICIES, ShimTestCase, program, run, last_json

MiB = 1 << 20



class Stitching(ShimTestCase):
    # One run per policy, shared by the tests that read it: each fills and checks over 200 MiB through
    # the simulated device (13 s under TSan).
    runs = {}

    def run_stitch(self, policy):
        if policy not in self.runs:
            # The cap leaves no room for new memory: 200 MiB is held once the ten blocks exist.
            r = run([program("e2e_vmm_stitch"), "stitch"], env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "200MiB"})
            self.assertRanOK(r)
            self.runs[policy] = (r, last_json(r))
        return self.runs[policy]

    def test_live_blocks_and_the_stitched_block_keep_their_bytes(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, out = self.run_stitch(policy)
                self.assertEqual(out["intact_before"], 10)
                self.assertEqual(out["live_intact_after_stitch"], 5)
                self.assertEqual(out["big_roundtrip"], 1, "the 100 MiB block reads back what was written")
                self.assertEqual(out["live_intact_after_big_write"], 5, "writing it clobbered a live block")
                self.assertEqual(out["overlap"], 0)
                self.assertEqual(r.device(0)["failed_allocs"], 0)

    def test_report_shows_the_stitch(self):
        r, out = self.run_stitch("vmm")
        pool = r.device(0)["pool"]
        # 100 chunks of 2 MiB created for the ten blocks, none after (the cap), none released:
        # the 50 freed chunks were unmapped and mapped again into the new range.
        self.assertEqual(pool["segment_allocs"], 100)
        self.assertEqual(pool["segment_frees"], 0)
        self.assertEqual(pool["unmap_calls"], 50)
        self.assertEqual(pool["map_calls"], 150)
        self.assertEqual(pool["peak_reserved_bytes"], 200 * MiB)
        self.assertEqual(pool["ooms"], 0)
        self.assertEqual(r.device(0)["peak_allocated_bytes"], 200 * MiB, "all of the memory was in use at once")
        # The new range is backed by the freed blocks' own memory: each of its 50 chunks holds,
        # unchanged, a chunk of what a freed block held.
        self.assertEqual(out["chunks"], 50)
        self.assertEqual(out["chunks_remapped_from_freed"], 50)

    def test_caching_serves_it_only_by_giving_memory_back(self):
        # The contrast: the caching policy cannot remap, so under the cap it releases the freed
        # segments to the driver and takes a new one; its memory starts out blank.
        r, out = self.run_stitch("caching")
        pool = r.device(0)["pool"]
        self.assertEqual(pool["segment_frees"], 5)
        self.assertEqual(pool["map_calls"], 0)
        self.assertEqual(out["chunks_remapped_from_freed"], 0)


class GrowthInPlace(ShimTestCase):
    def test_a_free_block_grows_where_it_is_and_live_data_survives(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_vmm_stitch"), "grow"], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["live_intact_after_growth"], 1)
                self.assertEqual(out["grown_roundtrip"], 1)
                self.assertEqual(out["live_intact_after_grown_write"], 1)
                if policy != "vmm":
                    continue
                self.assertEqual(out["same_address"], 1, "the 50 MiB block is the freed 30 MiB one, extended")
                self.assertEqual(out["freed_prefix_kept"], 1, "its first 30 MiB are the same memory, not remapped")
                pool = r.device(0)["pool"]
                # 10 + 15 chunks for the two blocks, then only the 10 the free block lacked.
                self.assertEqual(pool["segment_allocs"], 35)
                self.assertEqual(pool["map_calls"], 35)
                self.assertEqual(pool["unmap_calls"], 0)
                self.assertEqual(pool["peak_reserved_bytes"], 70 * MiB)


if __name__ == "__main__":
    unittest.main()
