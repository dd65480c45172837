"""Safe reuse under stress: many threads and every kind of stream freeing memory that slow device
work still writes, and a capture on another thread, under the pools (programs/reuse_integrity.cpp
checks every byte it reads back). Split from test_caching.py so that it runs under TSan, whose
subject it is (tests/e2e/CMakeLists.txt), and the rest of the caching tests under ASan."""

from shimtest import POLICIES, ShimTestCase, program, run, last_json


class SafeReuse(ShimTestCase):
    def test_detector_catches_unsafe_reuse(self):
        # Without waiting, a pending fill lands in the "new" data: the stress test below can fail.
        r = run([program("e2e_reuse_integrity"), "--self-test"], env={"GPUSHIM_POLICY": "passthrough"})
        self.assertRanOK(r)
        self.assertGreater(last_json(r)["self_test_corruptions"], 0)

    def test_detector_catches_a_pool_that_trusts_wrong_events(self):
        # A device whose events report completion before the work before them finished (a
        # deliberately broken fakecuda): a pool that reuses on such answers must be caught.
        r = run([program("e2e_reuse_integrity"), "2", "150", "4"],
                env={"GPUSHIM_POLICY": "caching", "GPUSHIM_QUARANTINE": "0", "FAKECUDA_BROKEN_EVENTS": "1"},
                timeout=300)
        self.assertGreater(last_json(r)["corruptions"], 0, r.stderr[-2000:])

    def test_integrity_stress_many_threads_and_streams(self):
        for policy, threads, iters, seed in [("caching", 4, 150, 1), ("caching", 2, 150, 2), ("vmm", 2, 150, 5),
                                             ("passthrough", 2, 50, 3)]:
            with self.subTest(policy=policy, threads=threads):
                r = run([program("e2e_reuse_integrity"), str(threads), str(iters), str(seed)],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_STACK_DEPTH": "8"}, timeout=300)
                out = last_json(r)
                self.assertRanOK(r)
                self.assertTrue(out["shim"])
                self.assertEqual(out["corruptions"], 0)
                self.assertEqual(out["overlaps"], 0)
                self.assertEqual(out["accounting_mismatches"], 0)
                self.assertGreaterEqual(out["checkpoints"], iters // 25)
                dev = r.device(0)
                self.assertEqual(dev["live_count"], 0)
                self.assertEqual(dev["pool"]["requested_bytes"], 0)
                if policy != "passthrough":
                    # Reuse waits for events, never for the device (memory is never short here).
                    self.assertGreater(dev["total_frees"], 0)
                    self.assertEqual(dev["pool"]["reuse_syncs"], 0)

    def test_tight_quarantine_still_safe(self):
        r = run([program("e2e_reuse_integrity"), "2", "100", "9"],
                env={"GPUSHIM_POLICY": "caching", "GPUSHIM_QUARANTINE": "0"}, timeout=300)
        self.assertRanOK(r)
        self.assertEqual(last_json(r)["corruptions"], 0)


    def test_training_loops_never_synchronize_and_stay_bounded(self):
        # Training-shaped loops whose host runs ahead of the (simulated) device: freed memory is
        # reused once its work is done, waiting for that work rather than growing when the device
        # lags, and the device is never synchronized.
        for policy in ["caching", "vmm"]:
            for args in (["e2e_train_loop"], ["e2e_demo_training_loop"]):
                with self.subTest(policy=policy, program=args[0]):
                    r = run([program(args[0])], env={"GPUSHIM_POLICY": policy})
                    self.assertRanOK(r)
                    dev = r.device(0)
                    self.assertEqual(dev["pool"]["reuse_syncs"], 0)
                    self.assertLess(dev["peak_reserved_bytes"], 1.3 * dev["peak_allocated_bytes"])


class CaptureElsewhere(ShimTestCase):
    def test_a_capture_on_another_thread_does_not_stop_a_stream_ordered_loop(self):
        # Thread B captures on its own stream (thread-local or relaxed: CUDA lets other threads go
        # on) while thread A allocates 16 MiB on its own stream 40 times, freeing and synchronizing
        # each step, on a 256 MiB device. A pool that held every block freed during the capture ran
        # out at step 15. Each freed block is reused on its stream at once, so the pool holds one.
        # (16 MiB on 256, not 64 on 1 GiB: the same steps to run out, a quarter of the pages the
        # simulated device touches; the run without the shim took 9 s.)
        MiB = 1 << 20
        args = ["40", "16"]
        for mode in ("thread_local", "relaxed"):
            cuda = run([program("e2e_capture_elsewhere"), mode, *args], env={"FAKECUDA_MEM": "256MiB"},
                       preload=False, expect_report=False)
            self.assertRanOK(cuda)
            self.assertEqual(last_json(cuda)["failed_at"], -1, cuda.stdout)
            for policy in POLICIES:
                with self.subTest(mode=mode, policy=policy):
                    r = run([program("e2e_capture_elsewhere"), mode, *args],
                            env={"GPUSHIM_POLICY": policy, "FAKECUDA_MEM": "256MiB"})
                    self.assertRanOK(r)
                    out = last_json(r)
                    self.assertEqual(out["failed_at"], -1, out)
                    self.assertEqual(out["capture_end"], "cudaSuccess")
                    if policy != "passthrough":
                        # One step's block, the capturer's 1 MiB buffer, at most 1 MiB of rounding.
                        self.assertLessEqual(out["peak_reserved_bytes"], 18 * MiB, out)
