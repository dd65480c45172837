// Hot-path templates of Shim (included from shim.h): the allocation and free paths of every hook,
// written once for the runtime and the driver API (ApiOf). Kept inline so that the forwarding lambda a
// hook passes costs nothing.
#pragma once

#include "core/call_context.h"
#include "cuda/error_codes.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "cuda/runtime_last_error.h"
#include "cuda/stream_registry.h"
#include "util/clock.h"
#include "util/thread_block.h"

namespace gpushim {

inline ModuleId Shim::caller_module() {
  const uintptr_t ra = current_hook_caller();
  const LastCaller& last = thread_slot<LastCaller, ThreadSlot::kLastCaller>();
  if (ra != 0 && ra == last.ra && modules_.generation() == last.generation) return last.module;
  return caller_module_lookup(ra);
}

inline int Shim::device_ordering(CUstream stream, bool per_thread) {
  // Default streams (0, legacy, per-thread) are the current context's: nothing to ask; nor is
  // anything with one device.
  if ((per_thread && stream == nullptr) || !names_created_stream(stream) || !several_devices()) return -1;
  return device_of_created_stream(stream);
}

inline void Shim::bind_thread_context(int device) {
  if (!thread_slot<bool, ThreadSlot::kContextChecked>()) bind_unchecked_thread_context(device);
}

inline cudaError_t ApiOf<cudaError_t>::from_pool(CUresult r) { return to_runtime_error(r); }
inline const char* ApiOf<cudaError_t>::name(cudaError_t e) {
  const RealRuntime& rt = real_runtime();
  const char* n = rt.cudaGetErrorName != nullptr ? rt.cudaGetErrorName(e) : nullptr;
  return n != nullptr ? n : "an error of the runtime";
}
inline const char* ApiOf<CUresult>::name(CUresult e) {
  const RealDriver& drv = real_driver();
  const char* n = nullptr;
  if (drv.cuGetErrorName == nullptr || drv.cuGetErrorName(e, &n) != CUDA_SUCCESS || n == nullptr)
    return "an error of the driver";
  return n;
}
inline cudaError_t ApiOf<cudaError_t>::refuse(cudaError_t e) {
  set_runtime_last_error(e);
  return e;
}
inline bool ApiOf<cudaError_t>::current_device(int* device) {
  const RealRuntime& rt = real_runtime();
  return rt.cudaGetDevice != nullptr && rt.cudaGetDevice(device) == cudaSuccess;
}
// A pool's answer as the runtime would give it, then in the driver's words: the same code a
// driver hook gave before it shared the runtime's path.
inline CUresult ApiOf<CUresult>::from_pool(CUresult r) { return to_driver_error(to_runtime_error(r)); }
inline bool ApiOf<CUresult>::current_device(int* device) { return current_context_device(device); }

// The out-of-memory error a forwarded allocation's caller gets, by name (ForwardedAlloc).
template <typename Api>
const char* out_of_memory_name(const ForwardedAlloc& a) {
  return a.out_of_memory_name != nullptr ? a.out_of_memory_name : Api::kOutOfMemoryName;
}

template <typename Api>
typename Api::Code Shim::inject(DeviceState* d, uint64_t size, const char* returned) {
  // Size 0 is CUDA's own argument error: never turned into an out-of-memory error.
  if (!faults_.active() || size == 0) return Api::kSuccess;
  const uint64_t number = faults_.select(size);
  if (number == 0) return Api::kSuccess;
  note_injected_failure(d, size, number, returned);
  return Api::refuse(Api::kOutOfMemory);
}

template <typename Api>
void Shim::count_failure(DeviceState* d, MemoryKind kind, int device, typename Api::Code code, uint64_t size,
                         StackId stack, const char* returned) {
  if (is_argument_error(code)) return;  // refused for its arguments: no failed allocation (error_codes.h)
  if (d == nullptr) {
    if (!on_device(kind)) books_.failed(kind, device);
    return;
  }
  d->ledger.failed();
  if (code == Api::kOutOfMemory) on_oom(d, size, stack, returned);
}

template <typename Forward>
cudaError_t Shim::device_alloc(void** out, size_t size, size_t requested, CUstream stream, bool stream_ordered,
                               Forward&& forward) {
  // A fork child of a CUDA process cannot use CUDA (the context is the parent's), so the pools'
  // segments are not its to hand out, and a pool lock another parent thread held at fork() would
  // stay held here forever. CUDA answers instead.
  if (forked_child_) return forward();
  DeviceState* d = current_device_state();
  if (d == nullptr || out == nullptr) return forward();  // CUDA decides the error for bad arguments
  // Under a context another thread destroyed CUDA refuses every request, and that answer comes
  // before GPUSHIM_FAIL's and the cap's, which would say out of memory instead. Forwarded below.
  const ContextRoute context = program_contexts_made() ? route_for_current_context(d, stream_ordered) : ContextRoute::kPool;
  const bool destroyed = context == ContextRoute::kRefusedByCuda;
  if (!destroyed)
    if (const cudaError_t refused = inject<RuntimeCodes>(d, size); refused != cudaSuccess) return refused;
  // A created stream of another device than the current one: CUDA allocates on the stream's
  // device, and the pool of the current one must not answer (its events cannot name that stream).
  // CUDA serves it, accounted on the stream's device.
  bool elsewhere = false;
  if (stream_ordered) {
    const int on = device_ordering(stream, /*per_thread=*/false);
    if (on >= 0 && on != d->ordinal) {
      d = device(on);
      if (d == nullptr) return forward();
      elsewhere = true;
    }
  }
  // cudaMallocAsync during capture makes graph-owned memory: that belongs to the real runtime. On
  // a stream whose capture failed (invalidated) CUDA refuses it, and answers that itself.
  const cudaStreamCaptureStatus capture = stream_ordered ? capture_status(stream) : cudaStreamCaptureStatusNone;
  const bool graph = capture == cudaStreamCaptureStatusActive;
  const bool failed_capture = capture == cudaStreamCaptureStatusInvalidated;
  // So does memory from a pool the program made current (cudaDeviceSetMemPool): its properties
  // and attributes are CUDA's to keep.
  const bool foreign_pool =
      stream_ordered && foreign_current_mempool_[d->ordinal].load(std::memory_order_relaxed);
  // And so does cudaMalloc under a context the program made (cuCtxCreate): CUDA's runtime
  // allocates in the current context, and the pools' memory is the primary context's; and any
  // request under one another thread destroyed, which CUDA refuses (context is destroyed).
  const bool foreign_context = context != ContextRoute::kPool;
  if (d->pool == nullptr || graph || failed_capture || foreign_pool || elsewhere || foreign_context) {
    ForwardedAlloc a;
    a.kind = graph ? MemoryKind::kGraph : MemoryKind::kDevice;  // graph memory is kept apart
    a.device = d->ordinal;
    a.size = size;
    a.requested = requested;
    a.stream = stream;
    a.stream_ordered = stream_ordered;
    a.cuda_pool = stream_ordered && !graph;
    a.cuda_refuses_first = destroyed;
    // Used only where the cap and GPUSHIM_FAIL are asked after the call: should CUDA serve a
    // request under a context that looked destroyed after all (a reset primary context, which the
    // runtime makes anew), this is how they undo it. Every other request here is capped before.
    auto undo = [](uintptr_t p) { free_served_after_all(p); };
    return account_forwarded<RuntimeCodes>(d, a, forward, [&] { return reinterpret_cast<uintptr_t>(*out); }, undo);
  }
  // cudaMalloc(0) hands out nothing, cudaMallocAsync(0) is an error: CUDA decides.
  if (size == 0) return forward();
  // During a capture CUDA refuses cudaMalloc, and cudaMallocAsync on a stream that is not the
  // capturing one (`graph` is false here), by its capture rules; the pool must answer the same.
  if (capture_forbids_unsafe_call(d->ordinal)) {
    d->ledger.failed();  // as CUDA's own refusal counts under passthrough
    return RuntimeCodes::refuse(cudaErrorStreamCaptureUnsupported);
  }
  bind_thread_context(d->ordinal);
  if (stream_ordered) learn_stream(stream);  // so that device fences cover it, and its end is heard of
  const StackId stack = capture_stack();
  void* p = nullptr;
  AllocationRecord rec{0, requested, tracing_ ? 0 : coarse_now_ns(), stack, static_cast<int16_t>(d->ordinal),
                       MemoryKind::kDevice, Route::kPooled, caller_module()};
  const CUresult r = d->ledger.pool_allocate(AllocRequest{size, stream, stream_ordered}, &p, rec, tracing_);
  if (r != CUDA_SUCCESS) {
    if (!is_argument_error(r)) d->ledger.failed();
    if (r == CUDA_ERROR_OUT_OF_MEMORY) on_oom(d, size, stack, RuntimeCodes::kOutOfMemoryName);
    return RuntimeCodes::refuse(to_runtime_error(r));
  }
  if (tracing_) recorded_trace_alloc(reinterpret_cast<uintptr_t>(p), rec, size, stream, stream_ordered);
  *out = p;
  recorded_event(rec.time_ns);
  return cudaSuccess;
}

template <typename Forward, typename Result, typename Undo>
auto Shim::forward_alloc(ForwardedAlloc a, Forward&& forward, Result&& result, Undo&& undo)
    -> std::invoke_result_t<Forward&> {
  using Api = ApiOf<std::invoke_result_t<Forward&>>;
  if (a.device_known_after || !on_device(a.kind))
    return account_forwarded<Api>(nullptr, a, forward, result, undo);
  if (a.device < 0 && !Api::current_device(&a.device)) return forward();  // no context: CUDA says
  DeviceState* d = device(a.device);
  if (d == nullptr) return forward();
  const char* const returned = out_of_memory_name<Api>(a);
  // As in device_alloc; only where the cap can undo what CUDA serves after all (a context that
  // looked destroyed), so that the cap holds whatever the answer.
  constexpr bool can_undo = !std::is_same_v<std::decay_t<Undo>, std::nullptr_t>;
  if (can_undo && program_contexts_made() &&
      route_for_current_context(d, a.stream_ordered) == ContextRoute::kRefusedByCuda)
    a.cuda_refuses_first = true;
  if (a.kind == MemoryKind::kDevice && a.injectable && !a.cuda_refuses_first)
    if (const auto refused = inject<Api>(d, a.size, returned); refused != Api::kSuccess) return refused;
  return account_forwarded<Api>(d, a, forward, result, undo);
}

template <typename Api, typename Forward, typename Result, typename Undo>
typename Api::Code Shim::account_forwarded(DeviceState* d, ForwardedAlloc a, Forward&& forward, Result&& result,
                                           Undo&& undo) {
  const StackId stack = capture_stack();
  const char* const returned = out_of_memory_name<Api>(a);
  // Under a cap, forwarded memory counts against it like a pool's segments would.
  const bool cap_first = d != nullptr && !a.size_known_after && !a.cuda_refuses_first;
  // Short of memory while the device's pool caches free memory: that goes back first, as for the
  // pool's own requests, and the cap (or CUDA) is asked again.
  const bool may_release = d != nullptr && a.kind == MemoryKind::kDevice;
  if (cap_first && !d->ledger.try_admit(a.size, a.cuda_pool) &&
      !(may_release && release_cached_for_forwarded(d) && d->ledger.try_admit(a.size, a.cuda_pool))) {
    d->ledger.failed();
    on_oom(d, a.size, stack, returned);
    return Api::refuse(Api::kOutOfMemory);
  }
  auto call_cuda = [&] {
    const RealCallScope in_cuda;
    return forward();
  };
  typename Api::Code code = call_cuda();
  // CUDA's own out of memory: asked again after the release, through the driver API only (the
  // runtime would keep the first failure as its last error, which a success cannot take back).
  if constexpr (std::is_same_v<typename Api::Code, CUresult>)
    if (code == Api::kOutOfMemory && may_release && release_cached_for_forwarded(d)) code = call_cuda();
  MadeAlloc made{0, a.size, a.device};
  if (code == Api::kSuccess) {
    if constexpr (std::is_same_v<std::invoke_result_t<Result&>, MadeAlloc>) {
      made = result();
      if (!a.device_known_after) made.device = a.device;
    } else {
      made.ptr = static_cast<uintptr_t>(result());
    }
  }
  if (a.device_known_after) {
    // The device is the call's answer, or on failure the caller's context's.
    if (made.ptr == 0 && !Api::current_device(&made.device)) return code;
    a.device = made.device;
    if (on_device(a.kind) && (d = device(a.device)) == nullptr) return code;
  }
  if (code != Api::kSuccess || made.ptr == 0) {  // ptr 0 on success: size 0, CUDA hands out nothing
    if (cap_first) d->ledger.settle(a.size, false);
    if (code != Api::kSuccess) count_failure<Api>(d, a.kind, a.device, code, a.size, stack, returned);
    return code;
  }
  // GPUSHIM_FAIL could not be asked before the call: CUDA was expected to refuse it (a context
  // that looked destroyed) or decides the device (an allocation from a memory pool). It is asked
  // now, and what CUDA made undone if it picks it. (Both are set only where there is an undo.)
  if constexpr (!std::is_same_v<std::decay_t<Undo>, std::nullptr_t>) {
    if ((a.cuda_refuses_first || a.device_known_after) && a.injectable && a.kind == MemoryKind::kDevice &&
        d != nullptr) {
      if (const auto refused = inject<Api>(d, a.size, returned); refused != Api::kSuccess) {
        undo(made.ptr);
        if (a.cuda_pool) cuda_pool_refused(d, a.pool);
        return refused;
      }
    }
  }
  if (cap_first) {
    d->ledger.settle(a.size, true, a.cuda_pool);
  } else if (d != nullptr) {
    // Made already: without a way to undo it, held whatever the cap says.
    constexpr bool can_undo = !std::is_same_v<std::decay_t<Undo>, std::nullptr_t>;
    if (!d->ledger.admit_made(made.size, can_undo, a.cuda_pool)) {
      if constexpr (can_undo) {
        undo(made.ptr);
        // The undo frees into CUDA's pool, which may keep the reservation it grew for it.
        if (a.cuda_pool) cuda_pool_refused(d, a.pool);
      }
      on_oom(d, made.size, stack, returned);
      return Api::refuse(Api::kOutOfMemory);
    }
  }
  const uint64_t t = record_time_ns();
  const AllocationRecord rec{made.size, a.requested, t, stack, static_cast<int16_t>(a.device),
                             a.kind, Route::kForwarded, caller_module()};
  // Into the trace too: its frees are recorded by deallocate(), and a trace without the
  // allocations undercounts every library that allocates through the driver API.
  if (books_.commit(made.ptr, rec) && tracing_)
    recorded_trace_alloc(made.ptr, rec, made.size, a.stream, a.stream_ordered);
  if (a.cuda_pool) cuda_pool_allocated(d, a.pool, made.ptr, made.size);
  recorded_event(t);
  return code;
}

template <typename Forward>
auto Shim::deallocate(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward, FreeApi api)
    -> std::invoke_result_t<Forward&> {
  using Api = ApiOf<std::invoke_result_t<Forward&>>;
  if (ptr == nullptr) return forward();  // legal no-op (and context initialization) in CUDA
  // A free during a capture that forbids it fails in CUDA, frees nothing, and invalidates the
  // capture; a pooled block must get the same answer (and stay live).
  // So does a stream-ordered free on a stream that is not capturing (one on the capturing stream
  // is the graph's).
  const cudaStreamCaptureStatus capture = stream_ordered ? capture_status(stream) : cudaStreamCaptureStatusNone;
  if (api != FreeApi::kHost && capture == cudaStreamCaptureStatusNone && capture_forbids_unsafe_call(-1))
    return Api::refuse(Api::kCaptureUnsupported);
  // On a stream whose capture failed (invalidated, not yet ended) CUDA refuses the free, and a
  // pooled block must stay live; anything else CUDA answers itself.
  if (capture == cudaStreamCaptureStatusInvalidated)
    return is_pooled_block(ptr) ? Api::refuse(Api::kCaptureInvalidated) : forward();
  // Where CUDA has no context to free in it refuses before it looks at the pointer; a pooled block
  // must get that answer too, and stay live and accounted (the program may free it from another
  // thread). The runtime binds a thread with none, so its hooks ask only once the program has
  // made a context (one load otherwise); the driver's ask whether the thread has one.
  constexpr bool driver_api = std::is_same_v<typename Api::Code, CUresult>;
  if (api == FreeApi::kDevice && (driver_api || program_contexts_made()))
    if (const CUresult refused = pooled_free_refused(ptr, stream, stream_ordered, driver_api); refused != CUDA_SUCCESS)
      return Api::refuse(Api::from_pool(refused));
  if (stream_ordered) learn_stream(stream);  // a pool's block will name it
  // Freed on a stream that is capturing: CUDA makes that a free node of the graph, which "must
  // therefore be passed the address of a graph allocation" (cuMemFreeAsync), and refuses anything
  // else with invalid value. A pooled block is never one (a capture's allocations are CUDA's own,
  // graph memory), so it gets CUDA's answer and stays the program's, live.
  if (capture == cudaStreamCaptureStatusActive && is_pooled_block(ptr)) {
    note_block_freed_in_graph();
    return Api::refuse(Api::kInvalidValue);
  }
  // A pool orders reuse by events it records in its own device's context, which cannot name a
  // stream of another device (and the legacy and per-thread default streams are one per context:
  // device 1's stream 0 is not device 0's). A stream-ordered free of a pooled block on such a
  // stream waits for that stream now, and the block goes back as a plain free. Rare (one process
  // driving several devices), and only then is the block's device looked up.
  if (stream_ordered && several_devices() && ordered_by_another_device(ptr, stream)) {
    const RealDriver& drv = real_driver();
    if (drv.cuStreamSynchronize == nullptr || drv.cuStreamSynchronize(stream) != CUDA_SUCCESS)
      return forward();  // CUDA says what is wrong with the stream (or the pointer)
    stream = nullptr;
    stream_ordered = false;
  }
  const uintptr_t key = reinterpret_cast<uintptr_t>(ptr);
  // Blocks of pools that keep their records: found, and their figures moved, in one lock and
  // one lookup. Anything else is in the tracker.
  AllocationRecord rec;
  DeviceLedger* owner = nullptr;
  const CUresult pooled = books_.release_pooled(ptr, stream, stream_ordered, api == FreeApi::kHost, &rec, &owner);
  if (pooled == CUDA_ERROR_NOT_PERMITTED) return mismatched_pooled_free(owner, ptr, stream, stream_ordered, forward);
  if (pooled != CUDA_ERROR_NOT_FOUND) {
    if (pooled != CUDA_SUCCESS) return Api::from_pool(pooled);
    if constexpr (!driver_api) bind_thread_context(-1);  // as the real cudaFree would have
    const uint64_t t = record_time_ns();
    if (tracing_) recorded_trace_free(t, key, rec, stream, stream_ordered);
    recorded_free(t, key, rec, /*late_check=*/true);
    return Api::kSuccess;
  }
  // Forget the pointer before the real free: once CUDA frees it, another thread may be handed the
  // same address and must be able to record it.
  if (!books_.forget(key, &rec)) return unknown_free(ptr, api, forward);
  if ((api == FreeApi::kHost) != (rec.kind == MemoryKind::kHost)) return mismatched_free(ptr, rec, forward);
  recorded_late_free();  // even if CUDA then refuses it (a runtime already unloading, say)
  // Forwarded frees are timed before CUDA releases the memory: once it does, another thread may
  // be handed the same address, and its alloc event must come after this free in the trace.
  // (Pooled ones are ordered by the pool itself; see recorder/trace_ordered_resource.h.)
  const uint64_t free_t = tracing_ && rec.route == Route::kForwarded ? now_ns() : 0;
  // Forwarded device memory may be one of CUDA's own pools' (Shim::cuda_pool_allocated).
  DeviceState* const pools_owner =
      rec.route == Route::kForwarded && rec.kind == MemoryKind::kDevice ? device(rec.device) : nullptr;
  if (rec.route == Route::kPooled) {
    const CUresult r = device(rec.device)->pool->deallocate(ptr, stream, stream_ordered);
    if (r != CUDA_SUCCESS) {
      books_.restore(key, rec);
      return Api::from_pool(r);
    }
    if constexpr (!driver_api) bind_thread_context(-1);
  } else {
    // Out of its CUDA pool's books too, before CUDA may hand the address out again.
    const CUmemoryPool from = pools_owner != nullptr && pools_owner->ledger.uses_cuda_pools()
                                  ? pools_owner->ledger.note_cuda_pool_free(key, rec.size)
                                  : nullptr;
    const auto code = [&] {
      const RealCallScope in_cuda;
      return forward();
    }();
    if (code != Api::kSuccess) {
      books_.restore(key, rec);
      if (from != nullptr) pools_owner->ledger.note_cuda_pool_alloc(from, key, rec.size);
      return code;
    }
  }
  books_.count_free(rec);
  // After the books: CUDA's pools keep freed memory or give it back (cudaFree of stream-ordered
  // memory is legal too): what each reserves is read again.
  if (pools_owner != nullptr && pools_owner->ledger.uses_cuda_pools()) refresh_cuda_pools(pools_owner);
  const uint64_t now = record_time_ns();
  const uint64_t t = rec.route == Route::kForwarded && tracing_ ? free_t : now;
  if (tracing_) recorded_trace_free(t, key, rec, stream, stream_ordered);
  recorded_free(t, key, rec, /*late_check=*/false);
  return Api::kSuccess;
}

template <typename Forward>
auto Shim::mismatched_free(void* ptr, const AllocationRecord& rec, Forward&& forward)
    -> std::invoke_result_t<Forward&> {
  using Api = ApiOf<std::invoke_result_t<Forward&>>;
  // cudaFreeHost of device memory, or cudaFree of pinned host memory: CUDA refuses it and keeps
  // the memory, so the record stays. Should CUDA accept it after all, the memory is gone.
  books_.restore(reinterpret_cast<uintptr_t>(ptr), rec);
  const auto code = forward();
  AllocationRecord gone;
  if (code == Api::kSuccess) books_.release(reinterpret_cast<uintptr_t>(ptr), &gone);
  return code;
}

template <typename Forward>
auto Shim::mismatched_pooled_free(DeviceLedger* d, void* ptr, CUstream stream, bool stream_ordered, Forward&& forward)
    -> std::invoke_result_t<Forward&> {
  using Api = ApiOf<std::invoke_result_t<Forward&>>;
  // As mismatched_free, for a block whose record its pool keeps: the block stays live while CUDA
  // answers. Should CUDA accept the free after all, the allocation is over: it goes back to the
  // pool with its figures, as a free by the right function would.
  const auto code = forward();
  AllocationRecord rec;
  if (code == Api::kSuccess &&
      d->release_pooled(ptr, stream, stream_ordered, /*host_api=*/false, &rec) == CUDA_SUCCESS && tracing_)
    recorded_trace_free(record_time_ns(), reinterpret_cast<uintptr_t>(ptr), rec, stream, stream_ordered);
  return code;
}

template <typename Forward>
auto Shim::unknown_free(void* ptr, FreeApi api, Forward&& forward) -> std::invoke_result_t<Forward&> {
  using Api = ApiOf<std::invoke_result_t<Forward&>>;
  // Inside memory a pool holds: a double free or an interior pointer. Forwarding could free a
  // whole segment under other live blocks, so refuse it.
  if (pool_contains(ptr)) {
    warn_invalid_free(ptr, api, "a double free, or a pointer inside a block", Api::name(Api::kInvalidValue));
    return Api::refuse(Api::kInvalidValue);
  }
  // Possibly memory from a path we did not see (the driver API); CUDA decides.
  const auto code = forward();
  if (code != Api::kSuccess) warn_invalid_free(ptr, api, "not a live CUDA allocation", Api::name(code));
  return code;
}

}  // namespace gpushim
