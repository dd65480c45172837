// The shim's core: lifecycle (the first CUDA call, fork, exit), the device table and dispatch.
// Hooks (hooks/) only translate CUDA calls into calls on this class; it sequences each over the
// books (accounting/device_ledger.h, the only writer of every figure), the device's pool and the
// real function, then tells the run's recorder what happened (recorder/run_recorder.h: the OOM
// log, resets, timeline, growth checkpoints, trace, live outputs and report are its, and this
// header only declares it, so that no hook sees a report, trace or live header).
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
#include <optional>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "accounting/allocation_tracker.h"
#include "accounting/device_ledger.h"
#include "accounting/driver_usage.h"
#include "accounting/memory_counters.h"
#include "accounting/array_books.h"
#include "accounting/vmm_tracker.h"
#include "config/config.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "policy/fault_injector.h"
#include "stacks/module_map.h"
#include "stacks/stack_capturer.h"
#include "stacks/stack_table.h"
#include "util/clock.h"
#include "util/iteration_counter.h"

namespace gpushim {

class RunRecorder;  // recorder/run_recorder.h: what the run records, and the report

constexpr int kMaxDevices = Ledgers::kMaxDevices;

// Per-device state. Created on first use of the device and never freed.
// The pool's chain is pool -> the ledger's cap (DeviceLedger::capped) -> DriverBackend (libcuda).
struct DeviceState {
  DeviceState(int ordinal, AllocationTracker& records) : ordinal(ordinal), ledger(ordinal, records) {}
  const int ordinal;
  uint64_t capacity = 0;                        // total device memory, learned at creation
  DeviceLedger ledger;                          // the device's figures; their only writer
  std::unique_ptr<Backend> driver;
  std::unique_ptr<DeviceMemoryResource> pool;   // null under passthrough
};

// Which free a hook implements: cudaFree-like calls free device and managed memory, cudaFreeHost
// pinned host memory; CUDA refuses the other kind, and so must the core. cuArrayDestroy and
// cuMipmappedArrayDestroy free device memory under the handle's key (ArrayBooks::key_of): lines
// name the handle the program passed.
enum class FreeApi : uint8_t { kDevice, kHost, kArray };

// An allocation a hook forwards to CUDA, as the core accounts it (Shim::forward_alloc).
struct ForwardedAlloc {
  MemoryKind kind = MemoryKind::kDevice;
  // -1: the calling thread's current device (the runtime's) or context's (the driver's); memory on
  // no device of ours (managed, pinned host) keeps what the hook says.
  int device = -1;
  uint64_t size = 0;       // what GPUSHIM_FAIL and the cap are asked about before the call (0: nothing)
  uint64_t requested = 0;  // what the caller asked for
  // The call decides the size (pitched memory: the driver picks the pitch): the cap is asked
  // after it, with what it made. GPUSHIM_FAIL is still asked before, with `size`.
  bool size_known_after = false;
  // The call decides the device too (an allocation from a memory pool): nothing is asked before.
  bool device_known_after = false;
  bool injectable = true;  // GPUSHIM_FAIL may fail it (device memory only)
  // CUDA refuses it for a reason of its own that comes first (a context another thread destroyed):
  // neither GPUSHIM_FAIL nor the cap is asked before it, so neither turns that answer into out of
  // memory.
  bool cuda_refuses_first = false;
  // The out-of-memory error the caller gets, named in lines and the report; null: the hook's API's.
  // A driver hook serving a runtime entry point that has no hook of its own (cudaMallocArray) names
  // the runtime's, which the runtime turns the driver's into.
  const char* out_of_memory_name = nullptr;
  CUstream stream = nullptr;
  bool stream_ordered = false;
  // Served by one of CUDA's own stream-ordered pools (`pool`, or null: the device's current one),
  // whose reservation beyond its allocations is held too (Shim::cuda_pool_allocated).
  bool cuda_pool = false;
  CUmemoryPool pool = nullptr;
};
// What the real call made: `Result` callbacks return this, or just the address (then of
// ForwardedAlloc::size bytes, on ForwardedAlloc::device). ptr 0: nothing was made.
struct MadeAlloc {
  uintptr_t ptr = 0;
  uint64_t size = 0;
  int device = -1;
};

// The two APIs a hook speaks, for the paths written once for both: error codes, and whether the
// caller's last error is ours to set.
template <typename Code>
struct ApiOf;
template <>
struct ApiOf<cudaError_t> {
  using Code = cudaError_t;
  static constexpr cudaError_t kSuccess = cudaSuccess;
  static constexpr cudaError_t kOutOfMemory = cudaErrorMemoryAllocation;
  static constexpr cudaError_t kInvalidValue = cudaErrorInvalidValue;
  static constexpr cudaError_t kCaptureUnsupported = cudaErrorStreamCaptureUnsupported;
  static constexpr cudaError_t kCaptureInvalidated = cudaErrorStreamCaptureInvalidated;
  static constexpr const char* kOutOfMemoryName = "cudaErrorMemoryAllocation";
  static const char* name(cudaError_t e);  // CUDA's own name of a code, for the lines the shim prints
  static cudaError_t from_pool(CUresult r);
  // An error the core returns in CUDA's place becomes the runtime's last error, as CUDA's would.
  static cudaError_t refuse(cudaError_t e);
  static bool current_device(int* device);
};
template <>
struct ApiOf<CUresult> {
  using Code = CUresult;
  static constexpr CUresult kSuccess = CUDA_SUCCESS;
  static constexpr CUresult kOutOfMemory = CUDA_ERROR_OUT_OF_MEMORY;
  static constexpr CUresult kInvalidValue = CUDA_ERROR_INVALID_VALUE;
  static constexpr CUresult kCaptureUnsupported = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  static constexpr CUresult kCaptureInvalidated = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  static constexpr const char* kOutOfMemoryName = "CUDA_ERROR_OUT_OF_MEMORY";
  static const char* name(CUresult e);
  static CUresult from_pool(CUresult r);
  static CUresult refuse(CUresult e) { return e; }  // the driver keeps no last error
  static bool current_device(int* device);
};
using RuntimeCodes = ApiOf<cudaError_t>;
using DriverCodes = ApiOf<CUresult>;

// The shim's own bookkeeping queries (CUDA's pool figures, free memory) run in relaxed capture
// mode, as PyTorch's do: otherwise a query CUDA counts as potentially unsafe, made while the
// program captures a graph, is refused and invalidates the program's capture (an H200, 2026-11-27).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool exchanged_ = false;
};

class Shim {
 public:
  // The initialized shim, or null when it is disabled (bad configuration) or being initialized by
  // this very thread (a re-entrant call must simply forward).
  // Inline: every hook calls it first.
  static Shim* get() {
    if (Shim* s = ready_.load(std::memory_order_acquire)) return s;
    return get_slow();
  }
  // The shim if it was ever initialized in this process; never initializes. Inline: every hook's
  // outermost CallScope asks it as it ends.
  static Shim* existing() { return instance_.load(std::memory_order_acquire); }

  const Config& config() const { return config_; }

  // ---- allocations and frees (core/shim_inl.h) ----
  // Device memory a pool may serve (cudaMalloc, cudaMallocAsync, cudaMallocPitch): the pool, or
  // `forward` (the real call, returning its cudaError_t) when no pool serves.
  template <typename Forward>
  cudaError_t device_alloc(void** out, size_t size, size_t requested, CUstream stream, bool stream_ordered,
                           Forward&& forward);
  // Any other allocation: `forward()` makes the real call (returning a cudaError_t or a CUresult,
  // which says the API), `result()` then says what it made, and `undo(ptr)` (if given) frees it
  // when the cap refuses memory whose size was known only after the call.
  template <typename Forward, typename Result, typename Undo = std::nullptr_t>
  auto forward_alloc(ForwardedAlloc a, Forward&& forward, Result&& result, Undo&& undo = nullptr)
      -> std::invoke_result_t<Forward&>;
  // Every free (cudaFree*, cuMemFree*): blocks we pooled go back to their pool, everything else to
  // `forward` (the real call, whose code type says the API).
  template <typename Forward>
  auto deallocate(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward, FreeApi api = FreeApi::kDevice)
      -> std::invoke_result_t<Forward&>;
  cudaError_t mem_get_info(size_t* free, size_t* total);
  // More than one device is visible: only then can a stream and a block be of different devices.
  // A count the driver refused counts as one device, and is not asked again here.
  bool several_devices() {
    const int n = visible_devices_.load(std::memory_order_relaxed);
    return (n == kCountNotAsked ? visible_device_count(/*ask_again=*/false) : n) > 1;
  }
  // The driver counts exactly one device; a refused count is asked again until it answers.
  bool sole_visible_device() { return visible_device_count(/*ask_again=*/true) == 1; }
  // The driver's device count (cuDeviceGetCount), kept once it answers; kCountRefused while it
  // refused (asked again only when `ask_again`).
  int visible_device_count(bool ask_again);
  // The device whose work `stream` orders where it may not be the current one (a created stream
  // of another device); -1 (the current device) otherwise, or when unknown.
  int device_ordering(CUstream stream, bool per_thread);
  int device_of_created_stream(CUstream stream);  // device_ordering's lookup (out of line)
  // Whether `ptr` is a pooled block of another device than the one whose work `stream` orders.
  bool ordered_by_another_device(void* ptr, CUstream stream);
  // Whether `ptr` is a block of one of our pools (not memory CUDA made).
  bool is_pooled_block(void* ptr);
  // The device among `devices` (a bit each) whose pool holds `ptr` as a pooled block; -1: none.
  int pooled_device_of(void* ptr, uint64_t devices);
  // Says once why a block freed during a capture stays out of its pool.
  static void note_block_freed_in_graph();

  // ---- the memory-pool API (core/shim_driver.cpp) ----
  // A device's default pool is served by the device's own pool: its attributes are our figures
  // (the report's), and trimming releases our cached memory. Each returns nullopt when the call
  // is not ours to answer (another pool, passthrough, an attribute only CUDA acts on): the hook
  // then forwards it.
  std::optional<CUresult> mempool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
  std::optional<CUresult> mempool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
  std::optional<CUresult> mempool_trim_to(CUmemoryPool pool, size_t keep);
  // cuMemPoolSetAccess succeeded: where `pool` is a device's default pool, which our pool serves,
  // the devices named get the same access to our pool's memory (DriverBackend::grant_access).
  void mempool_access_set(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count);
  // cuCtxEnablePeerAccess (`enabled`) or cuCtxDisablePeerAccess succeeded: the current context's
  // device may, or may no longer, use `peer`'s memory, our pool's on that device included.
  void peer_access_changed(CUcontext peer, bool enabled);
  // cuDeviceSetMemPool succeeded: `device`'s stream-ordered allocations come from `pool` now.
  void mempool_current_set(int device, CUmemoryPool pool);
  // A trim CUDA served (cuMemPoolTrimTo or the runtime's) succeeded: what `pool` reserves is read
  // again, so that reserved drops with it.
  void mempool_trimmed(CUmemoryPool pool);
  // The program asked one of CUDA's pools an attribute, and CUDA answered: a reading of what the
  // pool reserves is the freshest there is, and taken as the books' own. It is often the last
  // one: the shim reads at a stream-ordered free, before its stream gives the memory back, and
  // its reading when the run ends may come after CUDA's runtime has torn down (an H200, run 8).
  // PyTorch's cudaMallocAsync backend asks at every memory_stats().
  void mempool_read_by_program(CUmemoryPool pool, CUmemPool_attribute attr, const void* value);
  // cuMemPoolDestroy (the runtime's cudaMemPoolDestroy reaches it): `destroy` makes the real call.
  // On success the pool's reservation is held no more (what is still allocated from it stays
  // accounted until freed), and the pool is never named to the driver again.
  CUresult mempool_destroy(CUmemoryPool pool, absl::FunctionRef<CUresult()> destroy);

  // ---- the device table's figures, and the run's end ----
  // Figures of `d` as the report shows them (reserved from the pool, or = allocated).
  PoolFigures pool_figures(const DeviceState* d) const { return d->ledger.figures(); }
  // Host memory of the shim's own bookkeeping: stack table, live-allocation index, pool metadata,
  // the recorder's history.
  uint64_t host_bytes() const;
  // ---- the run's end (the recorder writes what leaves the process) ----
  // exit() or quick_exit(): the exit report, once.
  void on_process_exit();
  // The run ends now, with no exit() to follow (the exit report, and the end of the trace): a
  // termination signal, Python's os._exit, or CPython's death by SIGINT after a KeyboardInterrupt.
  void on_termination_signal();
  // Python's os._exit(status): the run ends now (as on_termination_signal); returns the status to
  // exit with, GPUSHIM_EXIT_CODE's where a verdict failed and the program's status was 0.
  int on_python_exit(int status);
  // The Python interpreter begins its teardown (python/interpreter_shutdown.h): the exit report's
  // live set, sites and growth are taken now; later frees still reach the pools as usual.
  void on_interpreter_shutdown();
  // Called from the library destructor, after everything else: the recorder finishes the run's
  // outputs, then GPUSHIM_EXIT_CODE's status replaces the program's if a verdict failed.
  void on_unload();
  // exit() reached from inside a hook on this thread (shim.cpp): the run's end writes nothing.
  bool exit_inside_hook();
  // gpushim_mark_iteration(): returns the iteration count after this mark.
  // Also recorded in the trace when one is on.
  uint64_t mark_iteration() { return on_iteration_mark(); }
  // ---- virtual memory, IPC and pointer queries (core/shim_driver.cpp) ----
  // Virtual-memory API bookkeeping, after the real call succeeded. cuMemCreate itself is a
  // forward_alloc of the handle's key (VmmTracker::key_of); vmm_created then notes its handle.
  void vmm_created(uint64_t handle, uint64_t size, MemoryKind kind, int device);
  void vmm_imported(uint64_t handle, int device);
  void vmm_retained(uint64_t handle);
  void vmm_released(uint64_t handle);
  void vmm_mapped(uintptr_t va, uint64_t size, uint64_t handle);
  void vmm_unmapped(uintptr_t va, uint64_t size);
  void va_reserved(uintptr_t va, uint64_t size);
  void va_freed(uintptr_t va);
  // CUDA arrays: each is a forward_alloc of its handle's key (ArrayBooks::key_of) and freed by a
  // deallocate of that key. array_created notes its context after the create succeeded;
  // array_destroying takes that note before the destroy is forwarded (as deallocate takes the
  // record), and array_not_destroyed puts it back when the destroy failed.
  void array_created(uintptr_t key);
  CUcontext array_destroying(uintptr_t key) { return arrays_.take(key); }
  void array_not_destroyed(uintptr_t key, CUcontext ctx) { arrays_.put_back(key, ctx); }
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
  // cuMemRetainAllocationHandle on `ptr`: false (with a line) for an address inside a pool, whose
  // physical allocation holds other blocks too: a peer that maps the handle would see their bytes.
  bool retain_allowed(uintptr_t ptr);
  // Called when the outermost hook of a thread returns: samples the driver's usage when due.
  // Inline, as every hook pays it: two relaxed loads when no sample is.
  void after_hook() {
    if (usage_pending_.load(std::memory_order_relaxed) == 0 && !usage_.requested()) return;
    sample_if_due();
  }
  // The program asked the driver for its memory figures (cudaMemGetInfo, cuMemGetInfo_v2): a good
  // moment to take a sample of the current device, whatever the interval says.
  void sample_usage_now();
  // ---- device resets (core/shim_driver.cpp) ----
  // The tracked allocations a context owns, as the driver says (its end is rare; a walk then
  // keeps the allocation path unchanged). `pool_memory`: stream-ordered memory allocated in it
  // counts too, which a primary context's end frees and cuCtxDestroy does not.
  struct OwnedAllocation {
    uintptr_t ptr;
    uint32_t serial;  // the same allocation still, not a new one at a reused address
  };
  std::vector<OwnedAllocation> owned_by_context(CUcontext ctx, bool pool_memory = false);
  // Before cudaDeviceReset or cuDevicePrimaryCtxReset of `device`: every live allocation of its
  // primary context is recorded as freed by the reset, and the pool gives all its memory back.
  // `owned`: what the context owned, asked before it ended (null: asked now, while it exists).
  void before_device_reset(int device, const std::vector<OwnedAllocation>* owned = nullptr);
  // After the real reset succeeded: the pool's backend retains the context again on next use.
  void after_device_reset(int device);
  // After a cuDevicePrimaryCtxRelease that destroyed the device's primary context.
  // `primary`: the context's handle, learned before the release (null: unknown); `owned`: what it
  // owned then (owned_by_context with its pool memory).
  void after_context_destroyed(int device, CUcontext primary, const std::vector<OwnedAllocation>& owned);
  // CUDA's own release of `device`'s primary context (the runtime's teardown at exit), made by
  // `release`: no reset of the program's, whose exit report still lists what it leaked. Should it
  // end the context, CUDA's memory pools of the device end with it: forgotten, so that the report's
  // last reading (refresh_cuda_pools_for_report) names none of them.
  CUresult runtime_release(int device, absl::FunctionRef<CUresult()> release);
  // What a context's end destroys of `device`'s pool state: CUDA's pools in the books, the default
  // and current pool, the release threshold.
  void forget_cuda_pools_of(int device);
  // cuCtxDestroy of a context the program created, with what owned_by_context said before it:
  // those are freed in the books and recorded as freed by the reset.
  void after_context_destroy(const std::vector<OwnedAllocation>& owned);
  // One allocation a context's end freed, out of the books (and an array's context entry): false
  // when it was freed meanwhile, or its address already belongs to a newer allocation.
  bool forget_owned(const OwnedAllocation& o, AllocationRecord* gone);
  // ---- stream and context lifetimes (core/shim_driver.cpp; the rule: cuda/stream_registry.h) ----
  // Before a cuStreamDestroy is forwarded: no pool block names `stream` afterwards.
  void before_stream_destroy(CUstream stream);
  // Before cuCtxDestroy(ctx) is forwarded: neither pool blocks nor device fences name a stream of
  // `ctx` afterwards.
  void before_context_destroy(CUcontext ctx);
  // True when the outermost hook was called by CUDA itself (libcudart, libcuda): e.g. the runtime
  // releasing its context while it tears down at exit, which is no reset of the program's.
  bool called_by_cuda();
  // An iteration mark (gpushim_mark_iteration): recorded in the trace. Returns its number (1, 2, ...).
  uint64_t on_iteration_mark();

  StackTable& stacks() { return stacks_; }
  const AllocationTracker& tracker() const { return books_.records(); }
  // Null for an invalid ordinal; creates it on first use.
  DeviceState* device(int ordinal) {
    if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
    if (DeviceState* d = devices_[ordinal].load(std::memory_order_acquire)) return d;
    return create_device(ordinal);
  }
  // Null for an invalid ordinal or one not used yet; never creates it.
  const DeviceState* existing_device(int ordinal) const {
    return ordinal >= 0 && ordinal < kMaxDevices ? devices_[ordinal].load(std::memory_order_acquire) : nullptr;
  }
  DeviceState* existing_device(int ordinal) {
    return const_cast<DeviceState*>(std::as_const(*this).existing_device(ordinal));
  }

 private:
  Shim(Config config, std::string exe);
  static Shim* get_slow();
  static Shim* slow_init();
  // The instance while it is ready for use (initialized, and not detached in a fork child);
  // null otherwise, and then get_slow() says why.
  static inline std::atomic<Shim*> ready_{nullptr};
  static inline std::atomic<Shim*> instance_{nullptr};  // set once initialized (existing()); null in a fork child

  std::unique_ptr<DeviceState> make_device(int ordinal);
  DeviceState* create_device(int ordinal);  // device()'s first use of an ordinal
  // Inline for the common stacks-off case (GPUSHIM_STACK_DEPTH=0): no call at all.
  StackId capture_stack() { return config_.stack_depth == 0 ? kEmptyStack : capture_stack_now(); }
  StackId capture_stack_now();
  void sample_if_due();
  // The state of the calling thread's current device (the runtime's cudaGetDevice), or null
  // where the runtime names none.
  DeviceState* current_device_state();
  // The capture status of `stream` (cudaStreamIsCapturing): none, active (its stream-ordered
  // requests make graph memory, CUDA's), or invalidated (a failed capture, not yet ended: CUDA
  // refuses its stream-ordered calls with cudaErrorStreamCaptureInvalidated, which a pool must
  // give too, freeing nothing). One load while no capture runs anywhere.
  static cudaStreamCaptureStatus capture_status(CUstream stream);
  static bool stream_capturing(CUstream stream) { return capture_status(stream) == cudaStreamCaptureStatusActive; }
  // The device whose default memory pool `pool` is, if its pool serves it; null otherwise.
  DeviceState* served_default_mempool(CUmemoryPool pool);
  CUmemoryPool default_mempool(int ordinal);  // learned from the driver once; null if unknown
  // True when CUDA forbids a potentially unsafe call (cudaMalloc, cudaFree, cudaMallocAsync on a
  // stream that is not capturing, pool queries) on this thread now: a capture in global or
  // thread-local mode (CUDA's rules). Asked of the driver with a call that CUDA checks the same way
  // and that changes nothing (a trim of `device`'s default pool that keeps everything), which also
  // invalidates the offending capture, as the real call would have: a pool answering instead of
  // CUDA must give CUDA's answer.
  bool capture_forbids_unsafe_call(int device);
  // `returned`: the error the caller gets (ApiOf<...>::kOutOfMemoryName).
  void on_oom(DeviceState* d, uint64_t requested, StackId stack, const char* returned, bool injected = false);
  // GPUSHIM_FAIL: the success code to go on, or the failure it chose for this allocation of
  // `size` bytes on `d`, accounted and reported like an OOM (the one place injection happens).
  // `returned` as on_oom's.
  template <typename Api>
  typename Api::Code inject(DeviceState* d, uint64_t size, const char* returned = Api::kOutOfMemoryName);
  // The one sequence for memory CUDA makes: the cap asked, the call made, the outcome accounted
  // (the record kept, or the failure counted and an OOM recorded). `d` is null for memory on no
  // device of ours, and while the call has yet to say the device (a.device_known_after).
  // Out of line: it must not grow device_alloc, whose pooled path is the hot one.
  template <typename Api, typename Forward, typename Result, typename Undo>
  __attribute__((noinline)) typename Api::Code account_forwarded(DeviceState* d, ForwardedAlloc a, Forward&& forward, Result&& result,
                                       Undo&& undo);
  // A call failed for the caller with `code`: counted where its figures are, an OOM recorded.
  template <typename Api>
  void count_failure(DeviceState* d, MemoryKind kind, int device, typename Api::Code code, uint64_t size,
                     StackId stack, const char* returned = Api::kOutOfMemoryName);
  // The time of an allocation or free as the hot path records it: precise while a trace is
  // recorded (its events are ordered by it), otherwise coarse. Without a trace the time only
  // decides whether a sample is due (a sample may then come up to one kernel tick late; its own
  // timestamp is precise, see RunRecorder::take_samples) and dates the record
  // (AllocationRecord::time_ns).
  uint64_t record_time_ns() const { return tracing_ ? now_ns() : coarse_now_ns(); }
  // The accounting and the line of an injected failure; `returned` names the code the caller gets.
  void note_injected_failure(DeviceState* d, uint64_t requested, uint64_t number, const char* returned);
  bool pool_contains(const void* ptr) const;
  // The hot path's hand-off to the recorder (shim.cpp): one call per event (and one more into
  // the trace while tracing), the recorder's per-event work inlined into it.
  void recorded_trace_alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream,
                            bool stream_ordered);
  void recorded_event(uint64_t t_ns);
  void recorded_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, bool late_check);
  void recorded_late_free();
  void recorded_trace_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream,
                           bool stream_ordered);
  // A free of a block that a pool keeping records refused: the wrong free function for it.
  template <typename Forward>
  auto mismatched_pooled_free(DeviceLedger* d, void* ptr, CUstream stream, bool stream_ordered, Forward&& forward)
      -> std::invoke_result_t<Forward&>;
  template <typename Forward>
  auto unknown_free(void* ptr, FreeApi api, Forward&& forward) -> std::invoke_result_t<Forward&>;
  template <typename Forward>
  auto mismatched_free(void* ptr, const AllocationRecord& rec, Forward&& forward) -> std::invoke_result_t<Forward&>;
  // One line with the caller's stack; counts the invalid free (RunRecorder::invalid_free).
  // `returned`: the name of the code the caller got (ApiOf<...>::name).
  void warn_invalid_free(const void* ptr, FreeApi api, const char* what, const char* returned);
  // A pool serves cudaMalloc (and cudaFree) without the real one running, which would have made
  // the device's primary context current on the calling thread: programs that go on with driver
  // calls (or pointer queries) rely on that. Done once per thread that has no current context.
  // `device` -1: the thread's current device (cudaFree binds that one, whatever the pointer's).
  // Inline (shim_inl.h): every pooled cudaMalloc and cudaFree asks, and all but a thread's first
  // find it checked; a call for that cost 1% of the 4 KiB pair's instructions.
  void bind_thread_context(int device);
  void bind_unchecked_thread_context(int device);
  // Who serves an allocation under the calling thread's context (DriverBackend::current_context):
  // `d`'s pool; CUDA (a context the program made, whose memory CUDA's runtime allocates there);
  // or CUDA's refusal, under a context another thread destroyed, which comes before anything the
  // shim would say (GPUSHIM_FAIL, the cap). kPool until the program has made a context of its own
  // (only then can the current one be another), so the common path pays one load.
  enum class ContextRoute : uint8_t { kPool, kCuda, kRefusedByCuda };
  ContextRoute route_for_current_context(DeviceState* d, bool stream_ordered);
  bool pool_serves_current_context(DeviceState* d, bool stream_ordered) {
    return route_for_current_context(d, stream_ordered) == ContextRoute::kPool;
  }
  // Short of memory (the cap, or the device) for a request CUDA serves itself (a library's
  // cuMemAlloc, memory of a program's context) while `d`'s pool caches free memory: that goes back
  // to the driver, as for the pool's own out-of-memory retry, so that the request can be asked
  // again. False if the pool caches nothing (nothing to ask again for).
  bool release_cached_for_forwarded(DeviceState* d);
  // Frees through the real runtime what CUDA served where it was expected to refuse (a context that
  // looked destroyed), once the cap or GPUSHIM_FAIL refuses it after the fact. cudaFree, also for
  // stream-ordered memory: it waits for the device, and so CUDA's pool gives the memory back at
  // once, where after cudaFreeAsync its reservation still counted against the cap and the
  // program's next allocation was refused too. A rare path (a request right after a reset).
  static void free_served_after_all(uintptr_t p);
  // What CUDA answers a free of `ptr`, if it is a pooled block, for want of a context to free it
  // in (it refuses before it looks at the pointer): the driver's refusal under a context destroyed
  // while current here; for the driver API (`driver_api`), also CUDA_ERROR_INVALID_CONTEXT on a
  // thread with none, unless a created stream names the context. Else CUDA_SUCCESS. The runtime
  // API's hooks ask once the program has made a context of its own.
  CUresult pooled_free_refused(void* ptr, CUstream stream, bool stream_ordered, bool driver_api);
  // The module that called into CUDA: the outermost hook's caller, or the first frame outside
  // libcudart, libcuda and the shim when that caller is the runtime acting for someone.
  // Inline: a thread allocates from the same few call sites over and over, and the last answer is
  // kept (LastCaller); the lookup is caller_module_lookup.
  ModuleId caller_module();
  ModuleId caller_module_lookup(uintptr_t ra);
  // The last return address a thread mapped to a module, for as long as the module map answers
  // from the same snapshot (snapshots are never freed, so a generation is never reused).
  struct LastCaller {
    uintptr_t ra, generation;
    ModuleId module;
  };
  // Under the cap, the device looks `limit` big: free is what the cap still allows.
  static void apply_cap(uint64_t limit, uint64_t held, size_t real_free, size_t real_total, size_t* free,
                        size_t* total);
  // True if a sample was recorded.
  bool sample_driver_usage(int device, bool current_context);
  void drop_vmm(const VmmTracker::Physical& p);
  // After a stream-ordered allocation CUDA's own pool served (no pool of ours did) of `size`
  // bytes at `ptr`, now in the books: what that pool (null: the device's current one) reserves
  // beyond the allocations the books hold from it is held too (DeviceLedger::note_cuda_pool_alloc).
  void cuda_pool_allocated(DeviceState* d, CUmemoryPool pool, uintptr_t ptr, uint64_t size);
  // After an allocation CUDA's own pool made was refused by the cap and freed again: the pool
  // keeps what it reserved for it (up to its release threshold), so that is held too.
  void cuda_pool_refused(DeviceState* d, CUmemoryPool pool);
  // The pool `ordinal`'s stream-ordered allocations come from now, as CUDA says; null if unknown.
  static CUmemoryPool current_mempool(int ordinal);
  // Every pool noted on `d` read again: after a free (a pool keeps memory or gives it back), and
  // at each driver-usage sample.
  void refresh_cuda_pools(DeviceState* d);
  // Every device's pools read again before the report's figures are taken (the run's end, the
  // interpreter's teardown): a stream-ordered free gives memory back when its stream gets there,
  // after the reading at the free, and nothing else may read the pool again before the end.
  void refresh_cuda_pools_for_report();
  // One pool's reading into `d`'s ledger; the caller holds cuda_pool_lifetimes_ shared.
  void read_cuda_pool(DeviceState* d, CUmemoryPool pool);
  // Every pool's blocks that name a stream `doomed` says is going are retagged (forget_streams).
  void forget_streams_in_pools(absl::FunctionRef<bool(CUstream)> doomed);
  // The recorder, lent what it reads: the books, the stacks, the device table (shim.cpp).
  RunRecorder* make_recorder(std::string exe);

  static void fork_prepare();
  static void fork_parent();
  static void fork_child();

 public:
  // Registers the three above, once: when the preload front attaches the core (before any hook
  // runs), or at the first initialization of a core used without a front (shim.cpp says why).
  static void install_fork_handlers();

 private:

  // ---- lifecycle ----
  const Config config_;
  bool forked_child_ = false;
  // ---- the hot path: what every allocation and free reads or writes ----
  StackTable stacks_;
  Ledgers books_;  // every figure of every device, and the records; their only writer
  IterationCounter iterations_;  // iteration marks and GPUSHIM_ITERATION_SITE calls
  StackCapturer capturer_;  // after stacks_ and iterations_, which it uses
  FaultInjector faults_;
  ModuleMap modules_;
  VmmTracker vmm_;
  ArrayBooks arrays_;  // each CUDA array's context (cuCtxDestroy frees them)
  DriverUsage usage_;  // the driver's view of usage, sampled as hooks return (after_hook)
  // What the run records beyond dispatch (recorder/run_recorder.h); made after the members it
  // reads, never freed (like the Shim).
  RunRecorder* const recorder_;
  const bool tracing_;  // GPUSHIM_TRACE is recorded: precise times, and the pools report their segments
  // ---- the device table ----
  std::atomic<DeviceState*> devices_[kMaxDevices] = {};
  static constexpr int kCountNotAsked = -1, kCountRefused = -2;
  std::atomic<int> visible_devices_{kCountNotAsked};  // visible_device_count()'s answer
  // The only visible device's state, once made (null: not yet, or not one device): the current
  // device can then be no other, and allocations do not ask the runtime (current_device_state).
  std::atomic<DeviceState*> sole_device_{nullptr};
  std::atomic<bool> sole_device_off_{false};  // the run is ending: the runtime is asked again
  void stop_sole_device();
  std::atomic<uint64_t> pooled_devices_{0};  // bit n: device n has state and a pool
  std::mutex devices_mu_;  // only for creating DeviceState
  std::atomic<uint64_t> usage_pending_{0};  // devices (bit per ordinal) not sampled yet
  // The memory-pool API (core/shim_driver.cpp), per device ordinal.
  std::atomic<CUmemoryPool> default_mempools_[kMaxDevices] = {};
  // cudaDeviceSetMemPool made another pool current: cudaMallocAsync then goes to CUDA, from it.
  std::atomic<bool> foreign_current_mempool_[kMaxDevices] = {};
  // What a program set as the default pool's release threshold; our pools cache freed memory
  // until trimmed or short of memory, which is what UINT64_MAX means to CUDA.
  std::atomic<uint64_t> release_thresholds_[kMaxDevices];
  // CUDA's pools are named to the driver (their figures read) only under this lock, shared;
  // cuMemPoolDestroy holds it alone around the real call and then forgets the pool: a destroyed
  // handle would crash the driver (docs/reliability.md, "Handles the program may destroy").
  std::shared_mutex cuda_pool_lifetimes_;
};

}  // namespace gpushim

#include "core/shim_inl.h"
