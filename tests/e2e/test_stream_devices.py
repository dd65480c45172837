"""Streams of one device ordering memory of another, and a pooled block freed inside a stream
capture (programs/cross_device_streams.cpp): the memory a program gets back is what CUDA would give
it. Each case corrupted memory, or allocated on the wrong device, under the pools until
2026-11-27 (a review helper's reproducers); passthrough is CUDA's own answer."""
import json
import unittest

from shimtest import POLICIES, ShimTestCase, last_json, program, start_runs

CASES = ("wrong_device", "wrong_device_driver", "legacy_cross_device", "ptds_cross_device", "captured_free",
         "peer_access_first")


TWO_DEVICES = {"FAKECUDA_DEVICES": "2"}


def job(case, policy, env, extra=()):
    """One run of the program's `case` (with `extra` arguments) under `policy` (for start_runs): the
    cases mostly wait for 300 ms fills of the simulated device, so each test starts all of its runs
    at once."""
    return [program("e2e_cross_device_streams"), case, *extra], {"GPUSHIM_POLICY": policy, "GPUSHIM_SUMMARY": "0", **env}


def start_cases(policies, cases, env=TWO_DEVICES, extra=()):
    return start_runs({(policy, case): job(case, policy, env, extra) for policy in policies for case in cases})


class StreamDevices(ShimTestCase):
    def test_memory_is_what_cuda_would_give(self):
        for (policy, case), run in start_cases(POLICIES, CASES).items():
            with self.subTest(policy=policy, case=case):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                if case.startswith("wrong_device"):
                    # cudaMallocAsync (cuMemAllocAsync: _driver) on a stream of device 1 while
                    # device 0 is current. The driver's call was booked (and capped) on device 0.
                    self.assertEqual(out["device"], 1, out)
                    self.assertEqual(r.device(1)["total_allocs"], 1, json.dumps(r.report["devices"]))
                    self.assertEqual(r.device(1)["live_count"], 0)
                    self.assertEqual(sum(d["total_allocs"] for d in r.report["devices"]), 1)
                else:
                    self.assertTrue(out["intact"], out)
                if case == "peer_access_first" and policy == "vmm":
                    # The pool's mappings follow the peer link both ways (read-write, then none).
                    self.assertEqual((out["access_with_peer"], out["access_without_peer"]), (3, 0), out)

    def test_streams_of_other_contexts_leave_the_devices_fences_working(self):
        # A stream of another device destroyed while device 0 is current: its tail event was
        # recorded in the caller's context and failed. A live non-blocking stream of a context the
        # program made (cuCtxCreate): the fence's event, the primary context's, could not be
        # recorded on it. Either way every later fence of the device failed: each round of
        # cudaMalloc+cudaFree of 64 MiB stayed held (100 rounds: 6,400 MiB) until 2026-11-27. The
        # controls destroy the stream with its device current, or make no context; foreign_ctx_stream then
        # destroys its context while fences may hold events made there, and goes on.
        # foreign_ctx_capture: such a stream destroyed while it captured, its capture begun while
        # the primary context was current (its tail's event was recorded in the wrong context);
        # _ctx_gone: its context destroyed mid-capture (the capture was kept under the caller's
        # context and outlived its own; the reset at the end destroyed its dead event).
        runs = start_cases(("caching", "vmm"), ("destroy_other_device", "destroy_same_device", "foreign_ctx_stream",
                                                "foreign_ctx_control", "foreign_ctx_capture",
                                                "foreign_ctx_capture_ctx_gone"))
        for (policy, case), run in runs.items():
            with self.subTest(policy=policy, case=case):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                self.assertLessEqual(out["peak_reserved_mib"], 128, out)
                self.assertEqual(out["reuse_syncs"], 0, out)

    def test_memory_short_while_another_contexts_stream_writes_a_freed_block(self):
        # Memory is handed out again over a block that a stream of a program-made context still
        # writes (live, or destroyed after the free: a tail). Freed with cudaFree (fence*), under a
        # cap: the pools wait for the fence, which covers that stream's event (or the tail), rather
        # than synchronize. Freed in that stream's order (oom*, trim*): the pool's synchronization,
        # when memory is short or on cudaMemPoolTrimTo, covers the primary context only, and
        # released the block to its new owner until 2026-11-27 (6 of 8 cases corrupt). Now it waits
        # for its own event: short of memory the allocation fails, and gets the block once that
        # context has synchronized; with room to grow (trim*) it gets new memory.
        expect = {  # case: (cap, oom, overlaps)
            "foreign_ctx_fence": ("24M", False, True),
            "foreign_ctx_fence_tail": ("24M", False, True),
            "foreign_ctx_oom": ("24M", True, True),
            "foreign_ctx_oom_tail": ("24M", True, True),
            "foreign_ctx_trim": (None, False, False),
            "foreign_ctx_trim_tail": (None, False, False),
            # Freed while a stream of the primary context captures a graph: the block was held for
            # a fence, and the synchronization released it (caching corrupt, vmm stopped by the
            # simulated device at an unmap; a review helper's reproducer).
            "foreign_ctx_capture_free": ("24M", True, True),
            "foreign_ctx_capture_free_trim": (None, False, False),
            # The stream destroyed during such a capture: its blocks got no event (none is recorded
            # during a capture) and the synchronization released them.
            "foreign_ctx_capture_destroy": ("24M", True, True),
            "foreign_ctx_capture_destroy_trim": (None, False, False),
        }
        runs = start_runs({(policy, case): job(case, policy, {"GPUSHIM_LIMIT": cap} if cap else {})
                           for policy in ("caching", "vmm") for case, (cap, _, _) in expect.items()})
        for (policy, case), run in runs.items():
            _, oom, overlaps = expect[case]
            with self.subTest(policy=policy, case=case):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                self.assertTrue(out["intact"], out)
                self.assertEqual((out["oom"], out["overlaps"]), (oom, overlaps), out)
                if case.startswith("foreign_ctx_fence"):
                    self.assertEqual(out["reuse_syncs"], 0, out)
                self.assertEqual(r.device(0)["live_count"], 0)

    def test_the_legacy_streams_of_two_contexts_are_two_streams(self):
        # One handle, CU_STREAM_LEGACY, names each context's own legacy stream: a block freed in the
        # order of one context's must not be reused at once in the order of the other's. _procaddr:
        # the context made with the cuCtxCreate that cuGetProcAddress hands out.
        # ptds_of_two_threads: two threads' per-thread default streams of one program-made context.
        runs = start_cases(POLICIES, ("legacy_from_program_ctx", "legacy_to_program_ctx",
                                      "legacy_from_program_ctx_procaddr", "ptds_of_two_threads"))
        for (policy, case), run in runs.items():
            with self.subTest(policy=policy, case=case):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                self.assertTrue(out["intact"], out)
                if policy != "passthrough":
                    self.assertFalse(out["same_block"], out)

    def test_a_program_working_in_its_own_context_reuses_in_stream_order(self):
        # The program makes a context (cuCtxCreate) and allocates there with the runtime: each of
        # 40 steps allocates 64 MiB on its stream (created, or that context's legacy stream), a
        # slow kernel writes it, and it is freed on the same stream. CUDA reuses that memory in
        # the stream's order at once. Since 120fb27 every such free waited for its event alone:
        # under a 256 MiB cap the fifth step failed (4 of 4 cases), without one the pools held
        # 2,560 MiB (a review helper's reproducer).
        # _per_thread: cudaStreamPerThread there; its blocks waited for their event alone and the
        # fifth step failed (caching and vmm; a review helper's reproducer).
        # 12 steps (each fills 64 MiB): past the fifth, and 768 MiB where every block was held.
        runs = start_cases(POLICIES, ("program_ctx_only", "program_ctx_only_legacy", "program_ctx_only_per_thread"),
                           env={"GPUSHIM_LIMIT": "256M"}, extra=("12",))
        for (policy, case), run in runs.items():
            with self.subTest(policy=policy, case=case):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["failed_at"], -1, out)
                if policy != "passthrough":
                    self.assertLessEqual(out["peak_reserved_mib"], 64, out)

    def test_a_reset_leaves_no_segment_in_the_pool(self):
        # A block that a stream of a program-made context still writes, freed in that stream's
        # order, then cudaDeviceReset from the primary context. The pool's synchronization before
        # the reset covers the primary context only, and since 120fb27 the block waits for its
        # own event: under caching the segment stayed in the pool across the reset, which freed
        # it, and two later cudaMalloc got overlapping memory (a review helper's reproducer). Now
        # the release before a reset gives back what the reset frees anyway (release_before_reset).
        for (policy, _), run in start_cases(POLICIES, ("foreign_ctx_reset",)).items():
            with self.subTest(policy=policy):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                self.assertFalse(out["overlap"], out)
                self.assertTrue(out["intact"], out)

    def test_waiting_for_a_stream_of_another_context_never_holds_the_program_up(self):
        # The pool waits for a fence that covers a stream of a program-made context whose host
        # function waits for another thread, which creates a stream meanwhile. The wait held the
        # stream registry's lock, which that creation needs: both waited forever (the program's
        # alarm says so after 15 s). Passthrough is CUDA's own answer.
        for (policy, case), run in start_cases(POLICIES, ("foreign_stream_wait", "foreign_stream_wait_control")).items():
            with self.subTest(policy=policy, case=case):
                r = run.result()
                self.assertRanOK(r)
                self.assertFalse(last_json(r)["deadlock"])

    def test_a_block_freed_in_a_capture_is_refused_as_cuda_refuses_it(self):
        # A free node takes graph memory only ("must therefore be passed the address of a graph
        # allocation"): CUDA refuses memory from outside the graph, and the block stays the
        # program's. The pools took it out of the pool and answered success until 2026-11-29,
        # modelled on the simulated device, which then accepted it (an adversarial helper's find).
        # One device: it runs on a GPU too, where passthrough is CUDA's own answer.
        for (policy, _), run in start_cases(POLICIES, ("captured_free",), env={}).items():
            with self.subTest(policy=policy):
                r = run.result()
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["refused"], "cudaErrorInvalidValue")
                self.assertFalse(out["same_block"])
                lines = [l for l in r.shim_lines() if "capturing stream" in l]
                self.assertEqual(len(lines), 0 if policy == "passthrough" else 1, r.stderr)
                # Freed after the capture; the program's four plain allocations were never freed.
                dev = r.device(0)
                self.assertEqual((dev["live_count"], dev["total_frees"]), (4, 1), json.dumps(r.report["devices"]))


if __name__ == "__main__":
    unittest.main()
