"""PyTorch's backend:cudaMallocAsync under the shim, mimicked call for call (programs/torch_async.cpp):
per-stream tensors reused without synchronization and with their data intact, record_stream's
event dance, empty_cache, the stats resets and a graph capture. torch.cuda's figures (the default
pool's attributes the program reads back) must be the report's, under every policy."""
import json

from shimtest import POLICIES, REAL_GPU, ShimTestCase, program, run


class TorchAsyncBackend(ShimTestCase):
    def test_the_async_backends_calls_under_every_policy(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_torch_async")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_STACK_DEPTH": "4",
                                                               "GPUSHIM_SAMPLE_MS": "1"})
                self.assertRanOK(r)
                out = json.loads(r.stdout.strip().splitlines()[-1])
                self.assertEqual(out["failures"], 0)
                dev = r.device(0)
                # torch.cuda.max_memory_allocated() / max_memory_reserved() before the reset are the
                # report's peaks (the peak phase is the largest of the run).
                self.assertEqual(out["peak_used"], dev["peak_allocated_bytes"])
                self.assertEqual(out["peak_reserved"], dev["peak_reserved_bytes"])
                self.assertGreaterEqual(out["peak_used"], 120953344)  # the peak phase's tensors
                self.assertEqual(dev["live_bytes"], 0)
                self.assertEqual(dev["total_allocs"], dev["total_frees"])
                # The capture's two allocations are graph memory, apart from the device's.
                graph = [m for m in r.report["other_memory"] if m["kind"] == "graph"]
                self.assertEqual([(m["total_allocs"], m["total_frees"], m["live_bytes"]) for m in graph], [(2, 2, 0)])
                if not REAL_GPU:
                    self.assertEqual(out["loop_device_syncs"], 0)
                if policy != "passthrough":
                    # Our pools reuse a stream-ordered free at once on its stream, and on the free's
                    # stream after record_stream's events, without synchronizing.
                    self.assertTrue(out["reused_same_stream"])
                    self.assertTrue(out["reused_free_stream"])
                self.assertFalse(r.report["invalid_frees"], r.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
