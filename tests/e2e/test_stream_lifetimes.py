"""Streams and contexts that end while the pools know them (tests/e2e/programs/stream_lifetimes.cpp).
A pool that named a destroyed stream to the driver crashes on a real GPU; the simulated device stops
the process with a misuse report instead, so each case passing means no stale handle was used, under
every policy, and the books are exact at exit."""
import json

from shimtest import POLICIES, REAL_GPU, ShimTestCase, program, run, scaled

MiB = 1 << 20


def out(r):
    return json.loads(r.stdout.strip().splitlines()[-1])


class StreamLifetimes(ShimTestCase):
    def run_case(self, policy, *args, env=None):
        r = run([program("e2e_stream_lifetimes"), *args], env={"GPUSHIM_POLICY": policy, **(env or {})}, timeout=300)
        self.assertRanOK(r)
        self.assertNotIn("misuse", r.stderr)
        return r

    def test_single_thread_cases(self):
        for policy in POLICIES:
            for case in ["freed_then_destroyed", "reset_live_stream", "reset_busy_destroyed", "ctx_destroy"]:
                with self.subTest(policy=policy, case=case):
                    r = self.run_case(policy, case)
                    if case == "freed_then_destroyed":
                        self.assertTrue(out(r)["intact"])
                    self.assertEqual(r.device(0)["live_count"], 0)

    def test_a_refused_context_destroy_leaves_its_streams_fenced(self):
        # cuCtxDestroy of the primary context is refused (CUDA_ERROR_INVALID_CONTEXT); the pools
        # had dropped its streams before the call, and a plain free then stopped waiting for the
        # 300 ms fill on one of them: the next allocation got the block while the fill still ran.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = self.run_case(policy, "refused_destroy")
                if not REAL_GPU:
                    self.assertEqual(out(r)["destroy"], 201)  # CUDA_ERROR_INVALID_CONTEXT
                self.assertTrue(out(r)["intact"], r.stdout + r.stderr)
                self.assertEqual(r.device(0)["live_count"], 0)

    def test_per_thread_default_stream_is_not_shared_between_threads(self):
        # Thread A frees on its per-thread stream while its 300 ms fill still runs; thread B's own
        # per-thread stream is another stream, which the fill does not order.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = self.run_case(policy, "per_thread")
                self.assertTrue(out(r)["intact"], r.stdout)
                self.assertFalse(out(r)["got_a_block"], "B got A's block while A's fill still ran")

    def test_driver_api_capture_is_the_graphs(self):
        for policy in ["caching", "vmm"]:
            with self.subTest(policy=policy):
                r = self.run_case(policy, "driver_capture")
                self.assertEqual(out(r)["end"], 0)
                # The allocation on the capturing stream is a graph node, never a pooled block.
                graph = [m for m in r.report["other_memory"] if m["kind"] == "graph"]
                self.assertEqual(len(graph), 1, r.report["other_memory"])
                self.assertEqual(graph[0]["total_allocs"], 1)
                self.assertEqual(r.device(0)["total_allocs"], 4)  # the plain rounds' only

    def test_abandoned_capture_does_not_stop_reuse(self):
        for policy in ["caching", "vmm"]:
            with self.subTest(policy=policy):
                r = self.run_case(policy, "abandoned_capture")
                # 64 rounds of 4 MiB: reused, not 256 MiB of segments nobody may reuse.
                self.assertLess(out(r)["peak_reserved"], 64 * MiB)

    def test_streams_created_and_destroyed_while_others_allocate(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = self.run_case(policy, "churn", "4", str(scaled(120, 20)))
                o = out(r)
                self.assertEqual(o["corruptions"], 0)
                dev = r.device(0)
                self.assertEqual(dev["live_count"], 0)
                self.assertEqual(dev["live_bytes"], 0)
                self.assertEqual(dev["total_allocs"], dev["total_frees"])
