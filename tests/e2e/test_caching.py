"""End-to-end tests of the caching policy: the cap, OOM recovery and its report, fault injection,
invalid frees, graph capture and CUDA's answers during one, all on the simulated device. Safe reuse
under threads and streams is test_safe_reuse.py."""
import json
import re
import os

from shimtest import POLICIES, ShimTestCase, program, run, last_json

MiB = 1 << 20


class Cap(ShimTestCase):
    def test_cap_in_bytes_and_percent(self):
        for policy in ["caching", "passthrough"]:
            for limit in ["256MiB", "25%"]:
                with self.subTest(policy=policy, limit=limit):
                    r = run([program("e2e_cap_and_oom"), "64"],
                            env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": limit, "FAKECUDA_MEM": "1GiB"})
                    self.assertRanOK(r)
                    out = last_json(r)
                    self.assertEqual(out["total_before"], 256 * MiB)
                    self.assertEqual(out["free_before"], 256 * MiB)
                    self.assertEqual(out["blocks"], 4, out)
                    self.assertEqual(out["error"], "cudaErrorMemoryAllocation")
                    self.assertEqual(out["total_at_oom"], 256 * MiB)
                    self.assertEqual(out["free_at_oom"], 0)
                    self.assertTrue(out["recovered"])
                    dev = r.device(0)
                    self.assertEqual(dev["limit_bytes"], 256 * MiB)
                    self.assertEqual(dev["failed_allocs"], 1)
                    self.assertLessEqual(dev["peak_reserved_bytes"], 256 * MiB)

    def test_device_capacity_without_cap(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_cap_and_oom"), "64"], env={"FAKECUDA_MEM": "512MiB", "GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["blocks"], 8)
                self.assertEqual(out["error"], "cudaErrorMemoryAllocation")
                self.assertTrue(out["recovered"])
                # The request the device refused was never reserved: the peak is what it gave.
                dev = r.device(0)
                self.assertEqual(dev["peak_reserved_bytes"], 512 * MiB)
                self.assertEqual(dev["peak_allocated_bytes"], 512 * MiB)

    def test_oom_section_in_report_and_line_on_stderr(self):
        r = run([program("e2e_cap_and_oom"), "64"], env={"GPUSHIM_LIMIT": "200MiB", "FAKECUDA_MEM": "1GiB"})
        self.assertRanOK(r)
        ooms = r.report["ooms"]
        self.assertEqual(len(ooms), 1)
        o = ooms[0]
        self.assertEqual(o["requested"], 64 * MiB)
        self.assertEqual(o["limit"], 200 * MiB)
        self.assertEqual(o["capacity"], 1024 * MiB)
        self.assertEqual(o["allocated"], 192 * MiB)
        self.assertEqual(o["reserved"], 192 * MiB)
        self.assertGreater(o["device_free"], 64 * MiB)
        self.assertIn("GPUSHIM_LIMIT", o["advice"])
        self.assertTrue(o["top_sites"])
        self.assertEqual(o["top_sites"][0]["live_bytes"], 192 * MiB)
        self.assertTrue(any("out of memory on device 0" in l for l in r.shim_lines()), r.stderr)

class FaultInjection(ShimTestCase):
    def test_pool_retries_once_after_a_driver_failure(self):
        r = run([program("e2e_cap_and_oom"), "64", "3"], env={"FAKECUDA_FAIL_ALLOC": "1", "GPUSHIM_POLICY": "caching"})
        self.assertRanOK(r)
        self.assertEqual(last_json(r)["blocks"], 3)
        self.assertEqual(r.device(0)["pool"]["alloc_retries"], 1)
        self.assertEqual(r.device(0)["failed_allocs"], 0)

    def test_caller_gets_the_error_when_the_retry_fails_too(self):
        r = run([program("e2e_cap_and_oom"), "64", "3"], env={"FAKECUDA_FAIL_ALLOC": "1,2", "GPUSHIM_POLICY": "caching"})
        self.assertRanOK(r)
        out = last_json(r)
        self.assertEqual(out["blocks"], 0)
        self.assertEqual(out["error"], "cudaErrorMemoryAllocation")
        dev = r.device(0)
        self.assertEqual(dev["failed_allocs"], 1)
        self.assertEqual(dev["pool"]["ooms"], 1)


class InvalidFrees(ShimTestCase):
    def test_same_codes_as_cuda_and_nothing_corrupted(self):
        codes = {}
        for policy in ["passthrough", "caching"]:
            r = run([program("e2e_invalid_frees")], env={"GPUSHIM_POLICY": policy})
            self.assertRanOK(r)
            out = last_json(r)
            self.assertTrue(out["intact"])
            codes[policy] = out
            warnings = [l for l in r.shim_lines() if "invalid free" in l]
            self.assertGreaterEqual(len(warnings), 2, r.stderr)
            self.assertTrue(any("free_twice" in w for w in warnings), warnings)
            # The double free names the allocation and the first free (compute-sanitizer's view).
            [double] = [w for w in warnings if "free_twice" in w]
            self.assertRegex(double, r"already freed: allocated \(4096 bytes\) at main \(invalid_frees\.cpp:16\)")
            self.assertRegex(double, r"first freed at main \(invalid_frees\.cpp:17\)")
            self.assertEqual(len(double.splitlines()), 1)
            self.assertGreaterEqual(r.report["invalid_frees"], 2)
            # Each line says the code the program got.
            returned = [re.search(r"; returned (\w+);", w).group(1) for w in warnings]
            self.assertLessEqual(set(returned), {out[k] for k in ["double_free", "interior", "host", "never"]}, warnings)
        self.assertEqual(codes["caching"]["double_free"], "cudaErrorInvalidValue")
        self.assertEqual(codes["caching"]["interior"], "cudaErrorInvalidValue")
        for key in ["double_free", "interior", "host", "never"]:
            self.assertEqual(codes["caching"][key], codes["passthrough"][key], key)


class GraphCapture(ShimTestCase):
    def test_no_synchronization_during_capture(self):
        for policy in ["caching", "passthrough"]:
            with self.subTest(policy=policy):
                # No quarantine: freed blocks are reusable at once, the case that tempts a sync. (A
                # pool setting under passthrough is refused as a contradiction.)
                env = {"GPUSHIM_POLICY": policy} if policy == "passthrough" else {"GPUSHIM_POLICY": policy,
                                                                                   "GPUSHIM_QUARANTINE": "0"}
                r = run([program("e2e_graph_capture")], env=env)
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["end_capture"], "cudaSuccess")
                self.assertEqual(out["malloc_in_capture"], "cudaSuccess")
                self.assertEqual(out["malloc_async_in_capture"], "cudaSuccess")


class ForwardedAfterCache(ShimTestCase):
    def test_a_librarys_driver_allocation_gets_the_memory_the_pool_caches(self):
        # The pool caches 200 MiB the program freed; a library then asks the driver for 100 MiB
        # (cuMemAlloc, which the shim forwards and accounts): on a 256 MiB device, and under a
        # 256 MiB cap, it was refused out of memory where CUDA serves it (a review helper's hunt,
        # 2026-11-29). The pool's cache now goes back first, as for its own requests.
        for name, env in (("device", {"FAKECUDA_MEM": "256MiB"}),
                          ("cap", {"FAKECUDA_MEM": "1GiB", "GPUSHIM_LIMIT": "256MiB"})):
            for policy in POLICIES:
                with self.subTest(case=name, policy=policy):
                    r = run([program("e2e_driver_alloc_after_cache")], env=dict(env, GPUSHIM_POLICY=policy))
                    self.assertRanOK(r)
                    self.assertEqual(json.loads(r.stdout), {"driver_alloc": 0, "holds": True}, r.stderr)
                    dev = r.device(0)
                    self.assertEqual((dev["live_count"], dev["failed_allocs"]), (0, 0), dev)


    def test_a_cache_that_waits_for_its_fence_is_not_fragmented(self):
        # 200 MiB freed with cudaFree just before exit: the whole cache waits for that free's
        # fence, with no free block ready. It read as 100% external fragmentation (a review
        # helper's hunt, 2026-11-29); waiting memory is not split.
        for policy in ("caching", "vmm"):
            with self.subTest(policy=policy):
                r = run([program("e2e_driver_alloc_after_cache"), "cached-only"], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                dev = r.device(0)
                self.assertEqual(dev["pool"]["quarantined_bytes"], 200 * MiB, dev["pool"])
                self.assertEqual(dev["pool"]["cached_free_bytes"], 200 * MiB, dev["pool"])
                self.assertEqual(dev["external_fragmentation"], 0.0)


class CaptureRules(ShimTestCase):
    def test_malloc_and_free_during_capture_get_cudas_answers(self):
        # Global and thread-local capture: cudaMalloc and cudaFree are refused with
        # cudaErrorStreamCaptureUnsupported (also as the last error), the capture is invalidated,
        # a refused free frees nothing; relaxed capture allows both. A pool answers as CUDA does.
        cuda = run([program("e2e_capture_rules")], preload=False, expect_report=False)
        self.assertRanOK(cuda)
        expected = json.loads(cuda.stdout)
        self.assertEqual(expected["global"]["malloc"], "cudaErrorStreamCaptureUnsupported")
        # Once invalidated, the capturing stream's own stream-ordered calls are refused too, and
        # the refused free keeps its block (under the pools they were served, or refused with
        # cudaErrorStreamCaptureUnsupported: a review helper's hunt, 2026-11-29).
        for label in ("global_invalidated", "thread_local_invalidated"):
            self.assertEqual(expected[label], {"invalidating": "cudaErrorStreamCaptureUnsupported", "status": 2,
                                               "malloc_async": "cudaErrorStreamCaptureInvalidated",
                                               "free_async": "cudaErrorStreamCaptureInvalidated",
                                               "end": "cudaErrorStreamCaptureInvalidated", "intact": True}, label)
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_capture_rules")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                self.assertEqual(json.loads(r.stdout), expected)


class CaptureQueries(ShimTestCase):
    """Which driver calls a capture forbids (programs/capture_queries.cpp): the simulated device must
    answer as an H200 did (tests/gpu/capture_queries_h200.jsonl), and the shim must not change any
    answer, under every policy (a pool that queried CUDA's pool inside the program's capture once
    invalidated it, on the H200 only)."""
    RECORDED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu",
                            "capture_queries_h200.jsonl")
    # Whether a queried stream or event has finished its last work is timing, not a capture rule.
    TIMING = {"CUDA_SUCCESS", "CUDA_ERROR_NOT_READY"}
    QUERIES = ("cuStreamQuery", "cuEventQuery")

    def parse(self, text):
        out = {}
        for line in text.splitlines():
            o = json.loads(line)
            timed = o["call"].startswith(self.QUERIES) and o["result"] in self.TIMING
            result = "ready or not" if timed else o["result"]
            out[(o["thread"], o["mode"], o["call"])] = (result, o["capture_after"], o["end"])
        return out

    def answers(self, r):
        self.assertRanOK(r)
        return self.parse(r.stdout)

    def test_the_devices_answers_are_an_h200s_and_the_shim_changes_none(self):
        with open(self.RECORDED) as f:
            recorded = self.parse(f.read())
        device = self.answers(run([program("e2e_capture_queries")], preload=False, expect_report=False))
        self.assertEqual(len(recorded), 27 * 3 * 3 + 1)  # every case the program makes, recorded
        self.assertEqual(device, recorded)
        refused = {k for k, v in recorded.items() if v[0] == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}
        self.assertIn(("other", "global", "cuMemPoolGetAttribute(USED_MEM_CURRENT)"), refused)
        self.assertNotIn(("other", "thread_local", "cuMemPoolGetAttribute(USED_MEM_CURRENT)"), refused)
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_capture_queries")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_SAMPLE_MS": "1"})
                self.assertEqual(self.answers(r), device)


class ReportFigures(ShimTestCase):
    def test_pool_figures_and_timeline(self):
        r = run([program("e2e_threads_alloc"), "2", "500"], env={"GPUSHIM_SAMPLE_MS": "1"})
        self.assertRanOK(r)
        dev = r.device(0)
        pool = dev["pool"]
        self.assertGreaterEqual(pool["reserved_bytes"], dev["live_bytes"])
        self.assertEqual(pool["cached_free_bytes"], pool["reserved_bytes"] - dev["live_bytes"])
        self.assertGreaterEqual(dev["peak_reserved_bytes"], dev["peak_allocated_bytes"])
        self.assertGreater(pool["segment_allocs"], 0)
        self.assertGreaterEqual(dev["live_bytes"], pool["requested_bytes"])
        self.assertAlmostEqual(dev["utilization"], dev["peak_allocated_bytes"] / dev["peak_reserved_bytes"], places=9)
        self.assertEqual(dev["internal_waste_bytes"], dev["live_bytes"] - pool["requested_bytes"])
        ready = pool["cached_free_bytes"] - pool["quarantined_bytes"]
        self.assertGreaterEqual(ready, 0)
        if ready:
            self.assertAlmostEqual(dev["external_fragmentation"], 1 - pool["largest_free_block"] / ready, places=9)
        self.assertTrue(r.report["timeline"])
        for s in r.report["timeline"]:
            self.assertGreaterEqual(s["reserved"], s["allocated"])

    def test_timeline_ends_at_the_report(self):
        # Samples are taken by allocations once the interval has passed: a run shorter than the
        # interval had one sample, its first allocation (16 MiB), and gpushim-plot of the report drew
        # nothing of the 176 MiB it ended with. The report's own instant now closes the series.
        r = run([program("e2e_demo_training_loop"), "40"], env={"GPUSHIM_SAMPLE_MS": "60000"})
        self.assertRanOK(r)
        dev = r.device(0)
        timeline = r.report["timeline"]
        self.assertEqual(len(timeline), 2, timeline)
        first, last = timeline
        self.assertEqual(first["allocated"], 16 * (1 << 20))
        self.assertEqual((last["device"], last["allocated"], last["reserved"]),
                         (0, dev["live_bytes"], dev["pool"]["reserved_bytes"]))
        self.assertGreater(last["t_s"], first["t_s"])
        self.assertLessEqual(last["t_s"], r.report["duration_s"])


if __name__ == "__main__":
    import unittest
    unittest.main()
