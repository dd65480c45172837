// The shim's core: the one object that owns configuration, accounting, stacks and the per-device
// policies. Hooks (hooks/) only translate CUDA calls into calls on this class.
//
// Lifetime: created on the first CUDA call (so processes that never touch CUDA pay nothing: no
// threads, files or output), never destroyed (frees that arrive during teardown stay safe).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "accounting/allocation_tracker.h"
#include "accounting/checkpoint_schedule.h"
#include "accounting/period_detector.h"
#include "util/iteration_counter.h"
#include "accounting/driver_usage.h"
#include "accounting/memory_counters.h"
#include "accounting/pooled_sites.h"
#include "accounting/recent_frees.h"
#include "accounting/site_history.h"
#include "accounting/time_series.h"
#include "accounting/vmm_tracker.h"
#include "config/config.h"
#include "live/live_outputs.h"
#include "policy/backend.h"
#include "policy/device_budget.h"
#include "policy/device_memory_resource.h"
#include "policy/fault_injector.h"
#include "policy/observed_backend.h"
#include "report/report_model.h"
#include "stacks/stack_capturer.h"
#include "stacks/module_map.h"
#include "stacks/stack_table.h"
#include "trace/trace_recorder.h"
#include "util/clock.h"

namespace gpushim {

constexpr int kMaxDevices = 64;

// Per-device state. Created on first use of the device and never freed.
// The pool's chain is pool -> LimitedBackend (the cap) -> DriverBackend (libcuda).
struct DeviceState {
  int ordinal = 0;
  uint64_t capacity = 0;                        // total device memory, learned at creation
  MemoryCounters counters;                      // device memory handed to callers
  DeviceBudget budget;                          // bytes held from the driver, and the cap
  std::unique_ptr<Backend> driver;
  std::unique_ptr<Backend> limited;
  std::unique_ptr<DeviceMemoryResource> pool;   // null under passthrough
  // The pool keeps the records of what it hands out (pool->holds_payloads()). Then the pool's
  // lock guards `pooled_sites`, and every write to `counters` (but on_failed) and to this
  // device's device-memory rows of the module table happens under it (Shim::under_device_lock).
  bool pool_keeps_records = false;
  PooledSites pooled_sites;
  std::atomic<uint64_t> ooms{0};                // out-of-memory errors returned to callers
  std::atomic<uint64_t> injected_failures{0};   // of those, failed on purpose by GPUSHIM_FAIL
  std::atomic<uint64_t> resets{0};              // resets (or destructions) of its primary context
  std::atomic<uint64_t> context_destroys{0};    // cuCtxDestroy of contexts that owned memory we tracked
  // GPUSHIM_TRACE only: the pool's backend becomes pool -> observed -> limited -> driver.
  std::unique_ptr<SegmentObserver> segment_tracer;
  std::unique_ptr<Backend> observed;
};

// An OOM as recorded on the failing path; symbolized only when a report is written.
struct OomRecord {
  uint64_t t_ns;
  int device;
  uint64_t requested;
  uint64_t device_free;
  uint64_t allocated;
  PoolFigures pool;
  StackId stack;
  std::vector<std::pair<StackId, SiteTotals>> top_sites;
  bool injected = false;  // GPUSHIM_FAIL, not a real shortage
};

// What a runtime hook hands the core: how to call the real function when forwarding.
enum class DeviceApi : uint8_t { kMalloc, kMallocAsync, kMallocPitch };
// Which free a hook implements: cudaFree-like calls free device and managed memory, cudaFreeHost
// pinned host memory; CUDA refuses the other kind, and so must the core.
enum class FreeApi : uint8_t { kDevice, kHost };

class Shim {
 public:
  // The initialized shim, or null when it is disabled (bad configuration) or being initialized by
  // this very thread (a re-entrant call must simply forward).
  // Inline: every hook calls it first.
  static Shim* get() {
    if (Shim* s = ready_.load(std::memory_order_acquire)) return s;
    return get_slow();
  }
  // The shim if it was ever initialized in this process; never initializes.
  static Shim* existing();

  const Config& config() const { return config_; }

  // ---- device memory (runtime API) ----
  // `forward` performs the real call and returns its cudaError_t; used when no pool serves.
  template <typename Forward>
  cudaError_t device_alloc(void** out, size_t size, size_t requested, CUstream stream, bool stream_ordered,
                           Forward&& forward);
  template <typename Forward>
  cudaError_t deallocate(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward,
                         FreeApi api = FreeApi::kDevice);
  cudaError_t mem_get_info(size_t* free, size_t* total);
  // GPUSHIM_FAIL for allocations that reach CUDA without device_alloc (passthrough's pitched
  // allocations): cudaSuccess to proceed, or the injected failure, already accounted.
  cudaError_t inject_if_chosen(uint64_t requested);

  // ---- the memory-pool API (core/shim_mempool.cpp) ----
  // A device's default pool is served by the device's own pool: its attributes are our figures
  // (the report's), and trimming releases our cached memory. Each returns nullopt when the call
  // is not ours to answer (another pool, passthrough, an attribute only CUDA acts on): the hook
  // then forwards it.
  std::optional<CUresult> mempool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
  std::optional<CUresult> mempool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
  std::optional<CUresult> mempool_trim_to(CUmemoryPool pool, size_t keep);
  // cuDeviceSetMemPool succeeded: `device`'s stream-ordered allocations come from `pool` now.
  void mempool_current_set(int device, CUmemoryPool pool);

  // ---- memory the shim only accounts (managed, pinned host, driver-level) ----
  void record_alloc(MemoryKind kind, int device, void* ptr, uint64_t size, uint64_t requested);
  void record_failure(MemoryKind kind, int device);

  // ---- reports ----
  // Builds the report of the current state (exit or on-demand snapshot).
  ReportData build_report(const char* reason);
  // Writes the report file and the stderr summary once; later calls do nothing.
  void write_exit_report();
  // Figures of `d` as the report shows them (reserved from the pool, or = allocated).
  PoolFigures pool_figures(const DeviceState* d) const;
  // Host memory of the shim's own bookkeeping: stack table, live-allocation index, pool metadata.
  uint64_t host_bytes() const;
  // Called from the library destructor, after everything else.
  void on_unload();
  // The run ends now (a termination signal): the exit report, and the end of the trace.
  void finish_run();
  // GPUSHIM_EXIT_CODE: the status that replaces `status` at exit (the program's own if it is not
  // 0, or no verdict failed). Decided when the exit report was written.
  int exit_status(int status) const;
  // The Python interpreter begins its teardown (python/interpreter_shutdown.h): the exit report's
  // live set, sites and growth are taken now; later frees still reach the pools as usual.
  void on_interpreter_shutdown();

  // ---- live outputs: metrics file and snapshots (core/shim_live.cpp) ----
  // The figures of every device as the metrics file shows them; cheap (no symbolization).
  std::vector<DeviceMetrics> live_device_metrics() const;
  // Device memory the process uses that no hook saw (context, module images), when known.
  // Issue 5 owns the measurement; until it lands this says "unknown" and the metrics file leaves
  // gpushim_unaccounted_bytes out. Called from the gpushim-live thread at every metrics update:
  // it must stay cheap and must not need a current CUDA context.
  std::optional<uint64_t> unaccounted_bytes(const DeviceState& d) const;
  // gpushim_mark_iteration(): returns the iteration count after this mark.
  // Also recorded in the trace when one is on (core/shim_trace.cpp).
  uint64_t mark_iteration() { return on_iteration_mark(); }
  // ---- driver API, virtual memory, IPC and pointer queries (core/shim_driver*.{h,cpp}) ----
  // An allocation a driver hook forwards to CUDA and accounts. `device` -1 means the current
  // context's. `forward()` makes the real call and returns its CUresult; `result()` then gives the
  // address it produced (0: none).
  template <typename Forward, typename Result>
  CUresult driver_alloc(MemoryKind kind, int device, uint64_t size, uint64_t requested, Forward&& forward,
                        Result&& result);
  // For real calls whose size or device is known only once they succeeded (pitched memory, memory
  // pools): accounts `ptr` then, and if the cap refuses it, calls `undo()` and returns out of memory.
  template <typename Undo>
  CUresult account_after(MemoryKind kind, int device, uintptr_t ptr, uint64_t size, uint64_t requested, Undo&& undo);
  // cuMemFree*, cuMemFreeAsync*, cuMemFreeHost: blocks we pooled go back to their pool, everything
  // else to `forward` (which returns the real CUresult).
  template <typename Forward>
  CUresult driver_free(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward,
                       FreeApi api = FreeApi::kDevice);
  // GPUSHIM_FAIL for device memory allocated through the driver API (driver_alloc, and pitched
  // memory, whose hook can only ask before the real call): CUDA_SUCCESS to proceed, or
  // CUDA_ERROR_OUT_OF_MEMORY, already accounted like a real one.
  CUresult driver_inject_if_chosen(int device, uint64_t requested);
  // A driver-level allocation failed with `r`: counted, and an out-of-memory recorded as usual.
  void driver_failure(MemoryKind kind, int device, CUresult r, uint64_t size);
  // Virtual-memory API bookkeeping. Device memory is charged (the cap) before cuMemCreate and
  // recorded after it succeeded; the others run after the real call succeeded.
  bool vmm_charge(int device, uint64_t size);
  void vmm_uncharge(int device, uint64_t size);  // cuMemCreate refused: the charge is cancelled
  void vmm_created(uint64_t handle, uint64_t size, MemoryKind kind, int device);
  void vmm_imported(uint64_t handle, int device);
  void vmm_retained(uint64_t handle);
  void vmm_released(uint64_t handle);
  void vmm_mapped(uintptr_t va, uint64_t size, uint64_t handle);
  void vmm_unmapped(uintptr_t va, uint64_t size);
  void va_reserved(uintptr_t va, uint64_t size);
  void va_freed(uintptr_t va);
  // cuMemGetInfo_v2, after the real call succeeded: the cap of the current context's device.
  void cap_driver_mem_info(size_t* free, size_t* total);
  // What an address inside one of our pools is to the program: a live block (base, size and an
  // id unique to this allocation), or memory it does not own (freed, or never handed out).
  enum class PooledAddress { kNotPooled, kLiveBlock, kNotAllocated };
  struct BlockView {
    uintptr_t base = 0;
    uint64_t size = 0;
    uint64_t buffer_id = 0;
    bool ipc_exportable = false;
  };
  PooledAddress pooled_address(uintptr_t ptr, BlockView* out);
  // Legacy IPC on `ptr`: true if CUDA's handle would give an importer exactly the caller's
  // bytes; otherwise logs why not (naming `api`, the policy and what works instead) and is false.
  bool ipc_export_allowed(uintptr_t ptr, const char* api);
  // Called when the outermost hook of a thread returns: samples the driver's usage when due.
  void after_hook();
  // The program asked the driver for its memory figures (cudaMemGetInfo, cuMemGetInfo_v2): a good
  // moment to take a sample of the current device, whatever the interval says.
  void sample_usage_now();
  // ---- device resets (core/shim_reset.cpp) ----
  // Before cudaDeviceReset or cuDevicePrimaryCtxReset of `device`: every live allocation of the
  // device is recorded as freed by the reset, and the pool gives all its memory back.
  void before_device_reset(int device);
  // After the real reset succeeded: the pool's backend retains the context again on next use.
  void after_device_reset(int device);
  // After a cuDevicePrimaryCtxRelease that destroyed the device's primary context.
  void after_context_destroyed(int device);
  // cuCtxDestroy of a context the program created. Before it: the tracked allocations the context
  // owns, as the driver says (destroy is rare; a walk then keeps the allocation path unchanged).
  // After it succeeded: those are freed in the books and recorded as freed by the reset.
  struct OwnedAllocation {
    uintptr_t ptr;
    uint32_t serial;  // the same allocation still, not a new one at a reused address
  };
  std::vector<OwnedAllocation> owned_by_context(CUcontext ctx);
  void after_context_destroy(const std::vector<OwnedAllocation>& owned);
  // True when the outermost hook was called by CUDA itself (libcudart, libcuda): e.g. the runtime
  // releasing its context while it tears down at exit, which is no reset of the program's.
  bool called_by_cuda();
  // ---- traces (core/shim_trace.cpp) ----
  // An iteration mark (gpushim_mark_iteration): recorded in the trace. Returns its number (1, 2, ...).
  uint64_t on_iteration_mark();

  StackTable& stacks() { return stacks_; }
  AllocationTracker& tracker() { return tracker_; }
  // Null for an invalid ordinal; creates it on first use.
  DeviceState* device(int ordinal) {
    if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
    if (DeviceState* d = devices_[ordinal].load(std::memory_order_acquire)) return d;
    return create_device(ordinal);
  }
  const DeviceState* existing_device(int ordinal) const {
    return ordinal >= 0 && ordinal < kMaxDevices ? devices_[ordinal].load(std::memory_order_acquire) : nullptr;
  }

 private:
  Shim(Config config, std::string exe);
  static Shim* get_slow();
  static Shim* slow_init();
  // The instance while it is ready for use (initialized, and not detached in a fork child);
  // null otherwise, and then get_slow() says why.
  static inline std::atomic<Shim*> ready_{nullptr};

  std::unique_ptr<DeviceState> make_device(int ordinal);
  DeviceState* create_device(int ordinal);  // device()'s first use of an ordinal
  StackId capture_stack();
  DeviceState* current_device_state();
  MemoryCounters& counters_for(MemoryKind kind, int device);
  static bool stream_capturing(CUstream stream);
  // The device whose default memory pool `pool` is, if its pool serves it; null otherwise.
  DeviceState* served_default_mempool(CUmemoryPool pool);
  CUmemoryPool default_mempool(int ordinal);  // learned from the driver once; null if unknown
  // True when CUDA forbids a potentially unsafe call (cudaMalloc, cudaFree) on this thread now: a
  // capture in global or thread-local mode (CUDA's rules). Asked of the driver with a call that
  // CUDA checks the same way (cuMemFree_v2(0)), which also invalidates the offending capture, as
  // the real call would have: a pool answering instead of CUDA must give CUDA's answer.
  static bool capture_forbids_unsafe_call();
  void on_oom(DeviceState* d, uint64_t requested, StackId stack, bool injected = false);
  // GPUSHIM_FAIL selected this allocation: account and report it like an OOM (core/shim_faults.cpp).
  cudaError_t injected_failure(DeviceState* d, uint64_t requested, uint64_t number);
  // The time of an allocation or free as the hot path records it: precise while a trace is
  // recorded (its events are ordered by it), otherwise coarse. Without a trace the time only
  // decides whether a sample is due (a sample may then come up to one kernel tick late; its own
  // timestamp is precise, see take_samples) and dates the record (AllocationRecord::time_ns).
  uint64_t record_time_ns() const { return trace_ ? now_ns() : coarse_now_ns(); }
  // The accounting and the line of an injected failure; `returned` names the code the caller gets.
  void note_injected_failure(DeviceState* d, uint64_t requested, uint64_t number, const char* returned);
  void maybe_sample(uint64_t now) {
    timeline_.maybe_sample(now, [&](auto&& append) { take_samples(append); });
    // Growth on logical time as well as on the clock (accounting/checkpoint_schedule.h).
    if (event_checkpoints_.on_event() || iteration_checkpoints_.due(iterations_.count()))
      sample_sites(now_ns() - start_ns_);  // `now` may be the coarse clock: a point needs the precise one
  }
  template <typename Append>
  void take_samples(Append&& append);
  // Growth tracking (shim_growth.cpp): per-site totals at each sampling instant, and the report's
  // growth section from them.
  void sample_sites(uint64_t t_ns);
  // `t_ns` (since start): the report's present, taken as the last checkpoint of every series.
  void add_growth(ReportData* r, Symbolizer& sym, uint64_t t_ns);
  bool pool_contains(const void* ptr) const;
  // Live totals per site: the tracker's (forwarded allocations, and pooled ones of pools that keep
  // no records) with those of every pool that keeps its own.
  std::vector<std::pair<SiteKey, SiteTotals>> sites() const;
  // Runs `f` under the lock that guards the figures of `kind` memory on `device`: the pool's when
  // it keeps the records (see DeviceState::pool_keeps_records), none otherwise.
  template <typename F>
  void under_device_lock(MemoryKind kind, int device, F&& f) const;
  // Allocations whose records the tracker keeps (forwarded ones, and pooled ones of pools that
  // keep none): insert and count; erase (counted by count_free once the memory is gone); put back.
  bool track(uintptr_t ptr, const AllocationRecord& rec);
  bool untrack(uintptr_t ptr, AllocationRecord* rec);
  void count_free(const AllocationRecord& rec);
  void retrack(uintptr_t ptr, const AllocationRecord& rec);
  // A free of a block that a pool keeping records refused: the wrong free function for it.
  template <typename Forward>
  cudaError_t mismatched_pooled_free(DeviceState* d, void* ptr, CUstream stream, bool stream_ordered,
                                     Forward&& forward);
  template <typename Forward>
  cudaError_t unknown_free(void* ptr, Forward&& forward);
  template <typename Forward>
  cudaError_t mismatched_free(void* ptr, const AllocationRecord& rec, Forward&& forward);
  // One line with the caller's stack; counts the invalid free.
  void warn_invalid_free(const void* ptr, const char* what);

  // Starts the metrics file and the snapshot signal, as configured (at the first CUDA call).
  void start_live_outputs();
  // At exit: stops the live thread, then writes the metrics file one last time from the exit
  // report's figures (null: no report was built; the live figures then).
  void finish_live_outputs(const ReportData* exit_report);
  // A pool serves cudaMalloc without the real one running, which would have made the device's
  // primary context current on the calling thread: programs that go on with driver calls (or
  // pointer queries) rely on that. Done once per thread that has no current context.
  void bind_thread_context(int device);
  // The module that called into CUDA: the outermost hook's caller, or the first frame outside
  // libcudart, libcuda and the shim when that caller is the runtime acting for someone.
  ModuleId caller_module();
  // Under the cap, the device looks `limit` big: free is what the cap still allows.
  static void apply_cap(uint64_t limit, uint64_t held, size_t real_free, size_t real_total, size_t* free,
                        size_t* total);
  // True if a sample was recorded.
  bool sample_driver_usage(int device, bool current_context);
  void add_driver_usage(int device, DeviceReport* out) const;
  void add_modules(ReportData* out);
  void drop_vmm(const VmmTracker::Physical& p);
  void note_freed_by_reset(const AllocationRecord& rec);
  // GPUSHIM_TRACE (core/shim_trace.cpp). Each is called only when trace_ is set.
  void start_trace();
  // `request` is the size the policy was asked for (differs from rec.requested for pitched memory).
  void trace_alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream, bool stream_ordered);
  void trace_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream, bool stream_ordered);
  void trace_oom(const OomRecord& oom);
  void trace_device(DeviceState* d);
  // The device's pool built to report segments and to order the trace as the pool orders its work.
  std::unique_ptr<DeviceMemoryResource> make_traced_pool(DeviceState* d);
  void finish_trace();

  static void fork_prepare();
  static void fork_parent();
  static void fork_child();
  // Set when the library is loaded, by registering the three above (shim.cpp says why then).
  static const bool fork_handlers_registered_;

  const Config config_;
  const std::string exe_;
  const uint64_t start_ns_;
  int pid_;
  StackTable stacks_;
  AllocationTracker tracker_;
  MemoryCounters managed_;
  MemoryCounters host_;
  std::atomic<DeviceState*> devices_[kMaxDevices] = {};
  // The devices whose pools keep their records, in creation order: a free asks each of them first.
  std::atomic<DeviceState*> record_pools_[kMaxDevices] = {};
  std::atomic<int> record_pool_count_{0};
  std::mutex devices_mu_;  // only for creating DeviceState
  std::atomic<uint64_t> invalid_frees_{0};
  RecentFrees recent_frees_;  // so that a double free can name the allocation and the first free
  std::atomic<uint64_t> late_frees_{0};
  std::atomic<uint64_t> oom_lines_{0};  // real (not injected) out-of-memory errors, for the rate limit
  std::atomic<bool> reported_{false};
  std::mutex report_mu_;  // a second exit path waits for the report the first is writing
  std::atomic<bool> trace_finished_{false};
  std::atomic<bool> verdict_failed_{false};  // GPUSHIM_EXIT_CODE's conditions held at exit
  // What was live when the Python interpreter began its teardown; set once, never freed.
  struct Teardown {
    uint64_t t_ns = 0;  // since start
    std::vector<std::pair<SiteKey, SiteTotals>> sites;
    std::vector<CounterSnapshot> devices;  // indexed by ordinal; live_count 0 for absent devices
  };
  std::atomic<const Teardown*> teardown_{nullptr};
  TimeSeries timeline_;
  std::mutex ooms_mu_;
  std::vector<OomRecord> ooms_;
  bool forked_child_ = false;
  LiveOutputs live_;
  IterationCounter iterations_;
  PeriodDetector periods_;                    // the loop structure of unmarked programs
  CheckpointSchedule event_checkpoints_;      // allocation calls and frees
  CheckpointSchedule iteration_checkpoints_;  // iteration marks and GPUSHIM_ITERATION_SITE calls
  SiteHistory site_history_;
  StackCapturer capturer_;  // after stacks_ and iterations_, which it uses
  FaultInjector faults_;
  ModuleMap modules_;
  VmmTracker vmm_;
  DriverUsage usage_;
  std::atomic<uint64_t> usage_pending_{0};  // devices (bit per ordinal) not sampled yet
  MemoryCounters graph_;
  MemoryCounters imported_;
  // The memory-pool API (core/shim_mempool.cpp), per device ordinal.
  std::atomic<CUmemoryPool> default_mempools_[kMaxDevices] = {};
  // cudaDeviceSetMemPool made another pool current: cudaMallocAsync then goes to CUDA, from it.
  std::atomic<bool> foreign_current_mempool_[kMaxDevices] = {};
  // What a program set as the default pool's release threshold; our pools cache freed memory
  // until trimmed or short of memory, which is what UINT64_MAX means to CUDA.
  std::atomic<uint64_t> release_thresholds_[kMaxDevices];
  std::mutex resets_mu_;
  absl::flat_hash_map<SiteKey, SiteTotals> freed_by_reset_;  // under resets_mu_
  std::unique_ptr<trace::TraceRecorder> trace_owner_;
  trace::TraceRecorder* trace_ = nullptr;  // null unless GPUSHIM_TRACE is on and the file opened
};

}  // namespace gpushim

#include "core/shim_inl.h"
#include "core/shim_driver_inl.h"
