"""End-to-end tests of the issue "see every device allocation": the three paths to the driver
(exported symbols, dlsym on a libcuda handle, cuGetProcAddress), libraries with a static runtime,
the virtual-memory API, graph memory, per-module attribution, unaccounted memory per device, and
pointer and IPC queries that stay truthful for pooled memory."""
import json
import os
import subprocess
import tempfile

from pythons import interpreters
from shimtest import BUILD, POLICIES, REAL_GPU, ShimTestCase, base_env, program, run, last_json

MiB = 1 << 20
LIBS = os.path.join(BUILD, "e2e-libs")
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
CU_MEMORYTYPE_DEVICE = 2
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_INVALID_VALUE = 1



def with_libs(env=None):
    """The test libraries on the library path (programs that link them need it)."""
    extra = dict(env or {})
    extra["LD_LIBRARY_PATH"] = LIBS + ":" + base_env()["LD_LIBRARY_PATH"] if "LD_LIBRARY_PATH" in base_env() else LIBS
    return extra


def modules(report, kind="device", device=None):
    """{module base name: row} of the report's per-module table."""
    out = {}
    for m in report["modules"]:
        if m["kind"] != kind or (device is not None and m["device"] != device):
            continue
        name = os.path.basename(m["module"])
        if name in out:
            raise AssertionError(f"module {name} twice for kind {kind}: {report['modules']}")
        out[name] = m
    return out


# Where the hooks that dlsym on a CUDA handle and cuGetProcAddress hand out live: the core, which the
# preloaded front (libgpushim.so, interpose/front/) loads at the first CUDA call.
HOOKS = "libgpushim-core.so:"

class EveryPath(ShimTestCase):
    """One process allocating through every path; the per-module table must account for all of it."""

    CONTEXT = 256 * MiB

    def run_all_paths(self, policy, depth):
        r = run([program("e2e_all_paths"), LIBS],
                env={"GPUSHIM_POLICY": policy, "GPUSHIM_STACK_DEPTH": str(depth), "GPUSHIM_SAMPLE_MS": "1",
                     "FAKECUDA_CONTEXT_MEM": str(self.CONTEXT)})
        self.assertRanOK(r)
        return r, last_json(r)

    def test_per_module_totals_match_what_each_part_allocated(self):
        for policy in POLICIES:
            for depth in (32, 0):
                with self.subTest(policy=policy, stack_depth=depth):
                    r, out = self.run_all_paths(policy, depth)
                    dev = modules(r.report, "device", 0)
                    expected = {
                        "e2e_all_paths": (out["program"], 1, 1),
                        "libe2e_dynamic_runtime.so": (out["dynamic_runtime"], 2, 2),
                        "libe2e_direct_driver.so": (out["direct_driver"], 1, 2),
                        "libe2e_nccl_like.so": (out["nccl_like"], 2, 2),
                        "libe2e_blas_like.so": (out["blas_like"], 1, 2),
                    }
                    # Exactly these modules: no frame of libcudart, libcuda or the shim, nothing unknown.
                    self.assertEqual(sorted(dev), sorted(expected), json.dumps(r.report["modules"], indent=1))
                    for name, (live, count, allocs) in expected.items():
                        self.assertEqual(dev[name]["live_bytes"], live, name)
                        self.assertEqual(dev[name]["live_count"], count, name)
                        self.assertEqual(dev[name]["total_allocs"], allocs, name)
                        self.assertEqual(dev[name]["total_frees"], allocs - count, name)
                    # Nothing counted twice: the device totals are the sum of the parts.
                    d = r.device(0)
                    self.assertEqual(d["live_bytes"], sum(v[0] for v in expected.values()))
                    self.assertEqual(d["live_count"], sum(v[1] for v in expected.values()))
                    self.assertEqual(d["total_allocs"], sum(v[2] for v in expected.values()))
                    host = modules(r.report, "host")
                    self.assertEqual(host["libe2e_direct_driver.so"]["live_bytes"], out["host_direct"])
                    self.assertEqual(host["libe2e_nccl_like.so"]["live_bytes"], out["host_nccl"])
                    self.assertEqual(host["libe2e_nccl_like.so"]["device"], -1)
                    managed = modules(r.report, "managed")
                    self.assertEqual(managed["libe2e_direct_driver.so"]["live_bytes"], out["managed"])
                    other = {o["kind"]: o for o in r.report["other_memory"]}
                    self.assertEqual(other["host"]["live_bytes"], out["host_direct"] + out["host_nccl"])
                    self.assertEqual(other["managed"]["live_bytes"], out["managed"])
                    self.assertNotIn("graph", other)
                    self.assertEqual(r.report["reserved_va_bytes"], 4 * MiB)  # the NCCL-like mapping's

    def test_unaccounted_is_what_the_driver_holds_beyond_every_allocation(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r, out = self.run_all_paths(policy, 32)
                d = r.device(0)
                # The last sample came after every allocation: the driver's figure is the fake's own.
                self.assertEqual(d["driver_used_bytes"], out["device_used"])
                # Held from the driver (reserved): under the pool its one 20 MiB segment (for the two
                # cudaMallocs it serves, 3 and 5 MiB) plus every allocation made past it (32 MiB);
                # under passthrough, every allocation. Plus what CUDA's own stream-ordered pool
                # reserves beyond what the driver-API libraries allocate from it: it grows in 32 MiB
                # chunks (on an H100, and on the simulated device). Nothing moved after the last sample.
                base = (20 + 32) * MiB if policy == "caching" else d["live_bytes"]
                slack = d["pool"]["reserved_bytes"] - base
                self.assertGreater(slack, 0)
                self.assertLess(slack, 32 * MiB)
                self.assertEqual(d["held_bytes"], d["pool"]["reserved_bytes"])
                self.assertLessEqual(d["peak_allocated_bytes"], d["peak_reserved_bytes"])
                self.assertLessEqual(d["utilization"], 1.0)
                self.assertEqual(d["unaccounted_bytes"], self.CONTEXT)
                self.assertEqual(d["driver_used_bytes"] - d["held_bytes"], self.CONTEXT)
                self.assertIsNotNone(d["usage_at_s"])

    def test_summary_shows_modules_and_unaccounted(self):
        r, _ = self.run_all_paths("caching", 32)
        summary = "\n".join(r.shim_lines())
        self.assertRegex(summary, r"device 0 live by module: .*libe2e_nccl_like\.so 13\.0 MiB")
        self.assertIn("device 0 unaccounted: 256.0 MiB", summary)


class ProcAddress(ShimTestCase):
    WRAPPED = {
        "alloc": "cuMemAlloc_v2",
        "alloc_async_legacy": "cuMemAllocAsync",
        "alloc_async_ptsz": "cuMemAllocAsync_ptsz",
        "free_async_ptsz": "cuMemFreeAsync_ptsz",
        "from_pool_ptsz": "cuMemAllocFromPoolAsync_ptsz",
        "get_proc_4": "cuGetProcAddress",
        "get_proc_5": "cuGetProcAddress_v2",
    }
    PASSED = {"memcpy_ptds": "cuMemcpy_ptds", "export_table": "cuGetExportTable"}

    def test_each_caller_gets_the_variant_it_asked_for(self):
        plain = run([program("e2e_proc_address")], preload=False, expect_report=False)
        self.assertRanOK(plain)
        shim = run([program("e2e_proc_address")])
        self.assertRanOK(shim)
        want, got = last_json(plain), last_json(shim)
        # The driver's own functions: the simulated driver's are named for the variant; what NVIDIA's
        # dladdr() names is the driver's business, so there only that they are the driver's.
        driver_fn = (lambda variant: "libcuda.so.1:" + variant) if not REAL_GPU else None
        for key, variant in self.WRAPPED.items():
            if driver_fn:
                self.assertEqual(want[key]["fn"], driver_fn(variant), key)  # what the driver itself gives
            else:
                self.assertTrue(want[key]["fn"].startswith("libcuda.so"), (key, want[key]))
            self.assertEqual(got[key]["fn"], HOOKS + variant, key)  # ours, for exactly that variant
        for key, variant in self.PASSED.items():
            self.assertEqual(got[key]["fn"], want[key]["fn"], key)  # the driver's own, untouched
            if driver_fn:
                self.assertEqual(got[key]["fn"], driver_fn(variant), key)
        for key in want:
            if isinstance(want[key], dict) and "status" in want[key]:
                # Same result and status as the driver gives.
                self.assertEqual(got[key]["result"], want[key]["result"], key)
                self.assertEqual(got[key]["status"], want[key]["status"], key)
                # The driver saw the caller's exact name, version and flags: only the simulated
                # driver counts the queries it gets (-1: not observable on NVIDIA's).
                self.assertEqual(got[key]["driver_saw_exact_query"], -1 if REAL_GPU else 1, key)
        for key in ("probe", "unknown", "too_new", "not_a_driver_name"):
            if not REAL_GPU:
                self.assertEqual(want[key]["fn"], "null", key)
            if want[key]["fn"] == "null":
                self.assertEqual(got[key]["fn"], "null", key)
        self.assertEqual(got["via_4_arg_ptsz"]["fn"], HOOKS + "cuMemAllocAsync_ptsz")
        self.assertEqual(got["export_table_call"], want["export_table_call"])
        self.assertEqual(got["runtime_entry_point_ptsz"], HOOKS + "cuMemAllocAsync_ptsz")
        self.assertEqual(got["runtime_entry_point_by_version"], HOOKS + "cuMemAlloc_v2")
        self.assertEqual(got["ptsz_alloc"], 0)
        # The allocation made through the _ptsz hook is accounted, to the program that made it.
        self.assertEqual(modules(shim.report)["e2e_proc_address"]["live_bytes"], 3 * MiB)
        self.assertEqual(shim.device(0)["live_bytes"], 3 * MiB)


class Dlsym(ShimTestCase):
    def test_rtld_next_and_default_keep_meaning_relative_to_the_caller(self):
        for preload in (False, True):
            with self.subTest(preload=preload):
                r = run([program("e2e_dlsym_paths"), LIBS], env=with_libs(), preload=preload, expect_report=preload)
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["next_chain"], "A>B")
                self.assertTrue(out["next_malloc_is_the_first_after_the_program"])
                self.assertEqual(out["default_from_local_scope"], 42)
                self.assertTrue(out["missing_is_null"])
                self.assertTrue(out["missing_sets_dlerror"])
                self.assertTrue(out["found_leaves_dlerror_clear"])

    def test_lookups_on_cuda_handles_give_hooks_for_hooked_names_only(self):
        r = run([program("e2e_dlsym_paths"), LIBS], env=with_libs())
        self.assertRanOK(r)
        out = last_json(r)
        for name in ("cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2"):
            self.assertEqual(out["cuda:" + name], HOOKS + name)
        for name in ("cuMemcpy", "cuInit"):
            self.assertEqual(out["cuda:" + name], "libcuda.so.1:" + name)
        for name in ("cudaMalloc", "cudaFree"):
            self.assertEqual(out["cudart:" + name], HOOKS + name)
        for name in ("cudaMemcpy", "cudaGetDevice"):
            self.assertEqual(out["cudart:" + name], "libcudart.so.13:" + name)
        # The global scope holds the preloaded front, whose trampoline jumps to the same hook.
        self.assertEqual(out["default:cudaMalloc"], "libgpushim.so:cudaMalloc")
        # The allocation made through the handle's cudaMalloc is seen.
        self.assertEqual(r.device(0)["live_bytes"], MiB)

    def test_python_ctypes_allocations_are_seen(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([interpreters()[0][0], os.path.join(SCRIPTS, "ctypes_cudart.py")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                d = r.device(0)
                self.assertEqual(d["live_bytes"], out["kept_bytes"])
                self.assertEqual(d["live_count"], out["kept_count"])
                self.assertEqual(d["total_allocs"], out["allocs"])
                self.assertEqual(d["total_frees"], out["frees"])
                mods = modules(r.report)
                self.assertEqual(len(mods), 1, mods)
                (name,) = mods
                self.assertFalse(name.startswith(("libcudart", "libcuda.so", "libgpushim")), name)
                self.assertNotEqual(name, "(unknown)")


class PointerQueries(ShimTestCase):
    def test_queries_describe_the_block_the_caller_was_given(self):
        outs = {}
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_pointer_queries")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                outs[policy] = out
                for key in ("range_result", "attr_start_result", "attrs_result", "freed_attrs_result"):
                    self.assertEqual(out[key], 0, key)
                for key in ("range_base_offset", "attr_start_offset", "attrs_start_offset_b",
                            "runtime_device_pointer_offset"):
                    self.assertEqual(out[key], 0, key)
                for key in ("range_size", "attr_range_size", "attrs_size_b"):
                    self.assertEqual(out[key], 4096, key)
                self.assertEqual(out["buffer_ids_differ"], 1)
                self.assertEqual(out["memory_type_b"], CU_MEMORYTYPE_DEVICE)
                self.assertEqual(out["device_b"], 0)
                self.assertEqual(out["runtime_type"], 2)  # cudaMemoryTypeDevice
                # Memory the vmm policy maps with cuMemMap cannot use legacy IPC (a CUDA rule).
                self.assertEqual(out["ipc_capable_a"], 0 if policy == "vmm" else 1)
                # Freed memory belongs to no allocation, even when a pool keeps its segment.
                self.assertEqual(out["freed_range_result"], CUDA_ERROR_NOT_FOUND)
                self.assertEqual(out["freed_attr_result"], CUDA_ERROR_INVALID_VALUE)
                # It wrote the segment's start there all the same (an adversarial helper's find).
                self.assertTrue(out["freed_attr_output_untouched"], out)
                self.assertEqual(out["freed_memory_type"], 0)
                # No handle for memory cuMemCreate did not make; under vmm the pool's chunk handle
                # was returned, and a peer mapping it read another block's bytes (a helper's find).
                self.assertEqual(out["retain_a_result"], CUDA_ERROR_INVALID_VALUE)
                self.assertEqual(out["retain_b_result"], CUDA_ERROR_INVALID_VALUE)
                retains = [l for l in r.shim_lines() if "cuMemRetainAllocationHandle" in l]
                self.assertEqual(len(retains), 0 if policy == "passthrough" else 2, r.stderr)
                for line in retains:
                    self.assertIn(f"GPUSHIM_POLICY={policy}", line)
        # Legacy IPC on the second block cannot be exact under the pool, and the attribute says so.
        self.assertEqual(outs["passthrough"]["ipc_capable_b"], 1)
        self.assertEqual(outs["caching"]["ipc_capable_b"], 0)
        differing = {k for k in outs["caching"] if outs["caching"][k] != outs["passthrough"][k]}
        self.assertEqual(differing, {"ipc_capable_b"})

    def test_tracing_changes_no_answer(self):
        # While a trace is recorded the pool sits behind the trace's ordering wrapper; every query
        # must still reach the pool (it once answered "not allocated" for every pooled block).
        for policy in POLICIES:
            with self.subTest(policy=policy):
                plain = run([program("e2e_pointer_queries")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(plain)
                with tempfile.TemporaryDirectory() as d:
                    traced = run([program("e2e_pointer_queries")],
                                 env={"GPUSHIM_POLICY": policy, "GPUSHIM_TRACE": os.path.join(d, "t.trace")})
                    self.assertRanOK(traced)
                    self.assertTrue(os.listdir(d), "no trace was written")
                a, b = last_json(plain), last_json(traced)
                self.assertEqual({k for k in a if a[k] != b.get(k)}, set(), (a, b))
                self.assertEqual(b["range_size"], 4096)


class Ipc(ShimTestCase):
    """Legacy IPC between two processes, the importer checking every byte it maps."""

    def test_pooled_blocks_are_exported_exactly_or_refused(self):
        r = run([program("e2e_ipc")], env={"GPUSHIM_POLICY": "caching"})
        self.assertRanOK(r)
        out = last_json(r)
        # A block that starts its segment: the importer maps exactly its bytes.
        for name in ("large", "small_first"):
            self.assertEqual(out[name], {"get": "cudaSuccess", "importer_exit": 0}, name)
        # A block inside a segment: refused, with one line naming the policy and what works.
        self.assertEqual(out["small_second"]["get"], "cudaErrorInvalidValue")
        lines = [l for l in r.shim_lines() if "cudaIpcGetMemHandle" in l]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("GPUSHIM_POLICY=caching", lines[0])
        self.assertIn("GPUSHIM_OWN_SEGMENT_MIN=4KiB", lines[0])
        self.assertIn("GPUSHIM_POLICY=passthrough", lines[0])

    def test_the_alternatives_the_message_names_work(self):
        for env in ({"GPUSHIM_POLICY": "passthrough"}, {"GPUSHIM_POLICY": "caching", "GPUSHIM_OWN_SEGMENT_MIN": "4KiB"}):
            with self.subTest(**env):
                r = run([program("e2e_ipc")], env=env)
                self.assertRanOK(r)
                out = last_json(r)
                for name in ("large", "small_first", "small_second"):
                    self.assertEqual(out[name], {"get": "cudaSuccess", "importer_exit": 0}, name)
                self.assertFalse([l for l in r.shim_lines() if "refused" in l], r.stderr)

    def test_own_segments_keep_exact_accounting(self):
        r = run([program("e2e_ipc")], env={"GPUSHIM_OWN_SEGMENT_MIN": "4KiB"})
        self.assertRanOK(r)
        d = r.device(0)
        self.assertEqual(d["live_bytes"], 32 * MiB + 2 * 4096)
        # Every block has a segment of its own: all of it is reserved and handed out.
        self.assertEqual(d["pool"]["reserved_bytes"], d["live_bytes"])
        self.assertEqual(d["pool"]["cached_free_bytes"], 0)
        self.assertEqual(d["pool"]["segment_allocs"], 3)


class VirtualMemory(ShimTestCase):
    def test_physical_memory_counted_once_until_released_and_unmapped(self):
        expected = {
            "start": 0, "created": 2 * MiB, "mapped": 2 * MiB, "released_while_mapped": 2 * MiB,
            "unmapped_after_release": 0, "unmapped_before_release": 4 * MiB, "released_after_unmap": 0,
            "retained_unmapped_released_once": 2 * MiB, "released_twice": 0, "two_mappings": 2 * MiB,
            "both_unmapped": 0, "imported_mapped": 2 * MiB, "import_done": 0, "live_at_exit": 6 * MiB,
        }
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_vmm_lifecycle")], env={"GPUSHIM_POLICY": policy, "FAKECUDA_CONTEXT_MEM": "64MiB",
                                                             "FAKECUDA_DEVICES": "2"})
                self.assertRanOK(r)
                out = last_json(r)
                for step, want in expected.items():
                    shim, driver = out[step]
                    self.assertEqual(driver, want, f"{step}: the driver's own figure")
                    self.assertEqual(shim, want, f"{step}: what the shim counts")
                # Host memory made with no current context: host memory, and no device created for it.
                self.assertEqual(out["host_create"], 0)
                other = {o["kind"]: o for o in r.report["other_memory"]}
                self.assertEqual(other["host"]["live_bytes"], 2 * MiB)
                self.assertEqual(r.device(0)["live_bytes"], 6 * MiB)
                self.assertEqual(r.device(0)["total_allocs"], 6)
                imported = other["imported"]
                self.assertEqual((imported["total_allocs"], imported["total_frees"], imported["live_bytes"],
                                  imported["peak_bytes"]), (1, 1, 0, 2 * MiB))
                self.assertEqual(r.report["reserved_va_bytes"], 0)
                self.assertEqual(modules(r.report, "device", 0)["e2e_vmm_lifecycle"]["live_bytes"], 6 * MiB)
                self.assertEqual(modules(r.report, "device", 1)["e2e_vmm_lifecycle"]["live_bytes"], 2 * MiB)
                self.assertEqual(r.device(0)["unaccounted_bytes"], 64 * MiB)
                # Device 1's memory is accounted without a context created there to do it.
                self.assertEqual(out["other_device_primary_active"], 0)
                self.assertEqual(out["other_device_used"], 2 * MiB)
                self.assertEqual(r.device(1)["live_bytes"], 2 * MiB)
                self.assertIsNone(r.device(1)["usage_at_s"])


class GraphMemory(ShimTestCase):
    def test_graph_memory_is_accounted_apart(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_graph_memory")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["node_device_live"], 0)
                self.assertEqual(out["captured_device_live"], 0)
                graph = {o["kind"]: o for o in r.report["other_memory"]}["graph"]
                self.assertEqual(graph["total_allocs"], 2)  # the node and the captured allocation
                self.assertEqual(graph["total_frees"], 1)
                self.assertEqual(graph["live_bytes"], 2 * MiB)
                self.assertEqual(graph["peak_bytes"], 8 * MiB)
                self.assertEqual(modules(r.report, "graph")["e2e_graph_memory"]["live_bytes"], 2 * MiB)
                self.assertEqual(r.device(0)["live_bytes"], 0)


class Cap(ShimTestCase):
    def test_memory_accounted_after_the_fact_leaves_the_cap_intact(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_pitch_then_cap")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "1GiB"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["after"], "cudaSuccess")
                self.assertGreaterEqual(out["pitch"], 1000)
                d = r.device(0)
                self.assertEqual(d["live_bytes"], 512 * MiB)
                self.assertEqual(d["pool"]["reserved_bytes"], out["reserved"])
                self.assertLess(out["reserved"], 1 << 30)  # no wrap-around of the held figure

    def test_pitched_memory_past_the_cap_is_refused_and_given_back(self):
        # The size of a pitched allocation is known only after CUDA made it (the runtime's under
        # passthrough, the driver's always): past the cap it must be refused and freed again.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_pitch_past_cap")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "256MiB"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["runtime"], "cudaErrorMemoryAllocation")
                self.assertEqual(out["last"], "cudaErrorMemoryAllocation")
                self.assertEqual(out["driver"], 2)  # CUDA_ERROR_OUT_OF_MEMORY
                self.assertEqual(out["live"], 200 * MiB)
                self.assertEqual(out["reserved"], 200 * MiB)
                d = r.device(0)
                self.assertEqual(d["pool"]["ooms"], 2)
                self.assertEqual(d["failed_allocs"], 2)
                if not REAL_GPU:  # a GPU's context and module images are unaccounted too
                    self.assertEqual(d["unaccounted_bytes"], 0)  # nothing CUDA made stayed behind
                self.assertEqual(d["live_bytes"], 0)
                self.assertEqual(len(r.report["ooms"]), 2)
                # Each out-of-memory line names the error its caller got, in the caller's API.
                self.assertEqual(r.stderr.count("; returned cudaErrorMemoryAllocation"), 1, r.stderr)
                self.assertEqual(r.stderr.count("; returned CUDA_ERROR_OUT_OF_MEMORY"), 1, r.stderr)


    def test_pool_memory_past_the_cap_leaves_the_pools_reservation_counted(self):
        # cudaMallocFromPoolAsync past the cap: made by CUDA's pool, then refused and freed into
        # it again. The pool keeps what it grew for it (threshold max); the shim once never read
        # that pool, so its reservation showed as unaccounted, context-like memory.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_pool_past_cap")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "256MiB"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["refused"], "cudaErrorMemoryAllocation")
                self.assertGreaterEqual(out["pool_reserved"], 100 * MiB)
                # The pool's reserve is held from the driver: 200 MiB + that + 50 MiB is past
                # 256 MiB (200 + 50 alone is not), and nothing is left for the cap to allow.
                self.assertEqual(out["beside"], "cudaErrorMemoryAllocation")
                self.assertEqual(out["free"], 0)
                d = r.device(0)
                self.assertEqual(d["failed_allocs"], 2)
                # The second refusal's advice names the pool's reserve, which the program can trim.
                self.assertIn("CUDA's own memory pools keep", r.report["ooms"][-1]["advice"])
                # The second refusal's advice names the pool's reserve, which the program can trim.
                self.assertIn("CUDA's own memory pools keep", r.report["ooms"][-1]["advice"])
                self.assertEqual(d["live_bytes"], 200 * MiB)
                self.assertEqual(out["reserved"], d["pool"]["reserved_bytes"])
                if not REAL_GPU:  # device-wide: a GPU's context, and the modules running beside
                    self.assertEqual(d["held_bytes"], d["driver_used_bytes"])
                    self.assertEqual(d["unaccounted_bytes"], 0)

class CudaPools(ShimTestCase):
    def test_reserved_follows_each_pool_through_frees_trims_and_destruction(self):
        # CUDA's pools reserve beyond what is allocated from them (32 MiB chunks on the simulated
        # device, as on an H100), and keep what is freed under a release threshold of max: held
        # from the driver, so part of reserved until trimmed or destroyed, pool by pool.
        if REAL_GPU:
            self.skipTest("reads the simulated driver's own figure of used memory (fakecudaDeviceUsedBytes)")
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_cuda_pools")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["default_destroy"], "cudaErrorInvalidValue")
                # The program's current pool destroyed: the default is current again, and the
                # default pool serves cudaMallocAsync again: CUDA's under passthrough, ours under
                # caching and vmm (whose default-pool attributes are the pool's own). Before the
                # destroy was heard of, the allocation still went to CUDA past our pool, which the
                # default pool's figure (ours) then did not show: 0.
                self.assertTrue(out["default_current_again"])
                self.assertEqual(out["default_pool_served"], 3 * MiB)
                # A release threshold set on the default pool holds for CUDA's own part of it too
                # (the driver API's stream-ordered calls), and so does a trim (a helper's find:
                # under caching and vmm CUDA's pool gave all of it back at each synchronization).
                self.assertGreaterEqual(out["driver_kept_by_cuda"], 16 * MiB)
                self.assertEqual(out["driver_trimmed_by_cuda"], 0)
                steps = out["steps"]
                self.assertEqual(steps["a_freed"][0], 128 * MiB)  # the fake keeps what it was told to
                for name, (cuda, shim) in steps.items():
                    self.assertEqual(shim, cuda, name)
                d = r.device(0)
                self.assertEqual(d["live_bytes"], 0)
                self.assertEqual(d["held_bytes"], d["driver_used_bytes"])
                self.assertEqual(d["unaccounted_bytes"], 0)
                self.assertEqual(d["pool"]["reserved_bytes"], 0)


    def test_peak_reserved_counts_a_pools_slack_under_memory_taken_later(self):
        # The pool keeps 32 MiB it no longer uses (on the simulated device; what CUDA says on a
        # GPU); 100 MiB from cudaMalloc and then 200 MiB from cuMemAlloc are each held on top of
        # it, then freed. The peak was once only raised where the pool's figure was read, so
        # both were missed: peak reserved 100 MiB with 132 MiB held.
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_cuda_pool_slack_peak")], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                out = last_json(r)
                slack = out["slack"]
                self.assertGreater(slack, 0)
                self.assertEqual(out["malloc"], [slack + 100 * MiB] * 2)
                # Under caching and vmm the pool of ours still caches the cudaMalloc'd 100 MiB.
                cached = 0 if policy == "passthrough" else 100 * MiB
                self.assertEqual(out["driver"], [slack + cached + 200 * MiB] * 2)
                d = r.device(0)
                self.assertEqual(d["peak_reserved_bytes"], slack + cached + 200 * MiB)
                self.assertEqual(d["pool"]["peak_reserved_bytes"], d["peak_reserved_bytes"])
                self.assertGreaterEqual(d["peak_reserved_bytes"], d["pool"]["reserved_bytes"])

    def test_reserved_at_exit_is_read_when_the_report_is_written(self):
        # The free is issued while the stream is busy, so the pool still reserves 128 MiB when
        # the shim reads it at the free; CUDA gives them back when the stream gets there. Nothing
        # reads the pool again before exit (the program does not ask it either): the report once
        # said 128 MiB reserved, held by nobody.
        cases = [(policy, "created") for policy in POLICIES] + [("passthrough", "default")]
        for policy, pool in cases:
            with self.subTest(policy=policy, pool=pool):
                r = run([program("e2e_pool_release_in_stream_order"), pool, "no-end-query"],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_SAMPLE_MS": "60000"})
                self.assertRanOK(r)
                out = last_json(r)
                # Still 128 MiB when the program asks the shim: nothing read the pool since the free.
                self.assertEqual(out, {"reserved_live": 128 * MiB, "shim_reserved_end": 128 * MiB})
                d = r.device(0)
                self.assertEqual(d["live_bytes"], 0)
                self.assertEqual(d["pool"]["reserved_bytes"], 0)
                self.assertEqual(d["peak_reserved_bytes"], 128 * MiB)

    def test_what_the_program_reads_of_a_pool_is_the_books_reading(self):
        # The program asks the pool what it reserves once its stream has given the memory back:
        # CUDA's answer is the freshest reading there is, and the shim's figures take it at once,
        # whatever happens to its own reading at exit (on an H200 the report kept the reading made
        # at the free, 128 MiB, while the program read 0).
        cases = [(policy, "created") for policy in POLICIES] + [("passthrough", "default")]
        for policy, pool in cases:
            with self.subTest(policy=policy, pool=pool):
                r = run([program("e2e_pool_release_in_stream_order"), pool],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_SAMPLE_MS": "60000"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out, {"reserved_live": 128 * MiB, "reserved_end": 0, "shim_reserved_end": 0})
                d = r.device(0)
                self.assertEqual(d["live_bytes"], 0)
                self.assertEqual(d["pool"]["reserved_bytes"], 0)
                self.assertEqual(d["peak_reserved_bytes"], 128 * MiB)

    def test_pools_the_runtimes_teardown_destroyed_are_not_read_for_the_report(self):
        # The runtime's teardown at exit releases its primary context before the exit report; the
        # last release destroys the device's memory pools with it. The shim skipped that release (no
        # reset of the program's) and then asked a destroyed pool what it reserves (the simulated
        # device stopped the process there: a GPU's driver may crash).
        if REAL_GPU:
            self.skipTest("the simulated runtime's fakecudaReleaseContextsAtTeardown")
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_pool_release_in_stream_order"), "created", "teardown", "no-end-query"],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_SAMPLE_MS": "60000"})
                self.assertRanOK(r)
                self.assertEqual(last_json(r), {"reserved_live": 128 * MiB, "shim_reserved_end": 128 * MiB})
                d = r.device(0)
                self.assertEqual(d["pool"]["reserved_bytes"], 0)
                self.assertEqual(d["peak_reserved_bytes"], 128 * MiB)
                self.assertEqual(r.report["freed_by_reset"], [])  # the runtime's release is no reset

class Unaccounted(ShimTestCase):
    def test_every_device_shows_its_context_as_unaccounted(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_unaccounted")], env={"GPUSHIM_POLICY": policy, "FAKECUDA_DEVICES": "2",
                                                           "FAKECUDA_CONTEXT_MEM": "128MiB", "GPUSHIM_SAMPLE_MS": "1"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["devices"], 2)
                for dev in (0, 1):
                    d = r.device(dev)
                    self.assertEqual(d["unaccounted_bytes"], 128 * MiB, dev)
                    self.assertEqual(d["driver_used_bytes"] - d["held_bytes"], 128 * MiB, dev)
                    # Both allocations of this device (runtime and driver API) are live, nothing twice.
                    self.assertEqual(d["live_bytes"], (dev + 1) * MiB + (dev + 3) * MiB, dev)
                d0 = r.device(0)
                self.assertEqual(d0["driver_used_bytes"], out["used0"])  # sampled after everything

    def test_cu_mem_get_info_is_capped_like_cuda_mem_get_info(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_unaccounted")], env={"GPUSHIM_POLICY": policy, "GPUSHIM_LIMIT": "1GiB",
                                                           "FAKECUDA_CONTEXT_MEM": "128MiB"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["total0"], 1 << 30)
                # Free is what the cap still allows: the limit less what the process holds (the
                # driver's figure less the context; these sizes need no rounding).
                self.assertEqual(out["free0"], (1 << 30) - (out["used0"] - 128 * MiB))
        r = run([program("e2e_unaccounted")], env={"FAKECUDA_CONTEXT_MEM": "128MiB"})
        self.assertEqual(last_json(r)["total0"], 16 << 30)  # uncapped: the device's own figure


if __name__ == "__main__":
    import unittest
    unittest.main()


class UnloadedModules(ShimTestCase):
    def test_frames_of_a_dlclosed_library_name_it_from_the_module_table(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_dlclose_leak"), LIBS], env={"GPUSHIM_POLICY": policy})
                self.assertRanOK(r)
                self.assertTrue(json.loads(r.stdout.strip().splitlines()[-1])["unloaded"])
                site = next(s for s in r.report["sites"] if s["live_bytes"] == 3 * MiB and s["kind"] == "device")
                frame = site["frames"][0]
                self.assertEqual(os.path.basename(frame["module"]), "libe2e_dynamic_runtime.so", site["frames"])
                self.assertGreater(frame["module_offset"], 0)
                self.assertLess(frame["module_offset"], 1 << 20)  # an offset into the library, not an address
