// Hot-path templates of Shim (included from shim.h). Kept inline so that the forwarding lambda a
// hook passes costs nothing.
#pragma once

#include "core/call_context.h"
#include "core/pooled_records.h"
#include "cuda/error_codes.h"
#include "cuda/runtime_last_error.h"
#include "util/clock.h"

namespace gpushim {

template <typename Forward>
cudaError_t Shim::device_alloc(void** out, size_t size, size_t requested, CUstream stream, bool stream_ordered,
                               Forward&& forward) {
  // A fork child of a CUDA process cannot use CUDA (the context is the parent's), so the pools'
  // segments are not its to hand out, and a pool lock another parent thread held at fork() would
  // stay held here forever. CUDA answers instead.
  if (forked_child_) return forward();
  DeviceState* d = current_device_state();
  if (d == nullptr || out == nullptr) return forward();  // CUDA decides the error for bad arguments
  if (faults_.active() && size != 0)
    if (const uint64_t number = faults_.select(size)) return injected_failure(d, size, number);
  // cudaMallocAsync during capture makes graph-owned memory: that belongs to the real runtime.
  const bool graph = stream_ordered && stream_capturing(stream);
  // So does memory from a pool the program made current (cudaDeviceSetMemPool): its properties
  // and attributes are CUDA's to keep.
  const bool foreign_pool =
      stream_ordered && foreign_current_mempool_[d->ordinal].load(std::memory_order_relaxed);
  if (d->pool == nullptr || graph || foreign_pool) {
    const StackId stack = capture_stack();
    // Under a cap, forwarded memory counts against it like a pool's segments would.
    if (!d->budget.try_charge(size)) {
      d->counters.on_failed();
      on_oom(d, size, stack);
      set_runtime_last_error(cudaErrorMemoryAllocation);
      return cudaErrorMemoryAllocation;
    }
    const cudaError_t err = forward();
    if (err != cudaSuccess || *out == nullptr) {  // *out null: size 0, CUDA hands out nothing
      d->budget.cancel(size);
      if (err != cudaSuccess && !is_argument_error(err)) {
        d->counters.on_failed();
        if (err == cudaErrorMemoryAllocation) on_oom(d, size, stack);
      }
      return err;
    }
    d->budget.commit(size);
    const uint64_t t = record_time_ns();
    const MemoryKind kind = graph ? MemoryKind::kGraph : MemoryKind::kDevice;  // graph memory is kept apart
    const AllocationRecord rec{size, requested, t, stack, static_cast<int16_t>(d->ordinal),
                               kind, Route::kForwarded, caller_module()};
    if (track(reinterpret_cast<uintptr_t>(*out), rec) && trace_)
      trace_alloc(reinterpret_cast<uintptr_t>(*out), rec, size, stream, stream_ordered);
    maybe_sample(t);
    return err;
  }
  // cudaMalloc(0) hands out nothing, cudaMallocAsync(0) is an error: CUDA decides.
  if (size == 0) return forward();
  if (!stream_ordered && capture_forbids_unsafe_call()) {
    d->counters.on_failed();  // as CUDA's own refusal counts under passthrough
    set_runtime_last_error(cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;
  }
  bind_thread_context(d->ordinal);
  const StackId stack = capture_stack();
  void* p = nullptr;
  uint64_t allocated = 0;
  const AllocRequest req{size, stream, stream_ordered};
  AllocationRecord rec{0, requested, trace_ ? 0 : coarse_now_ns(), stack, static_cast<int16_t>(d->ordinal),
                       MemoryKind::kDevice, Route::kPooled, caller_module()};
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  bool in_block = false;  // the record went into the pool's block
  if (d->pool_keeps_records) {
    // One lock, one lookup: the record and every figure move with the block (pooled_records.h).
    PooledAlloc hooks(d->counters, d->pooled_sites, tracker_, rec, trace_ != nullptr);  // fills in `rec`
    r = d->pool->allocate_with(req, &p, &allocated, hooks);
    in_block = r != CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!in_block) r = d->pool->allocate(req, &p, &allocated);
  if (r != CUDA_SUCCESS) {
    if (!is_argument_error(r)) d->counters.on_failed();
    if (r == CUDA_ERROR_OUT_OF_MEMORY) on_oom(d, size, stack);
    set_runtime_last_error(to_runtime_error(r));
    return to_runtime_error(r);
  }
  if (!in_block) {
    rec.size = allocated;
    if (trace_) rec.time_ns = now_ns();
    under_device_lock(MemoryKind::kDevice, d->ordinal, [&] {
      tracker_.insert(reinterpret_cast<uintptr_t>(p), rec);
      d->counters.on_alloc(allocated, requested);
    });
  }
  if (trace_) trace_alloc(reinterpret_cast<uintptr_t>(p), rec, size, stream, stream_ordered);
  *out = p;
  maybe_sample(rec.time_ns);
  return cudaSuccess;
}

template <typename Forward>
cudaError_t Shim::deallocate(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward, FreeApi api) {
  if (ptr == nullptr) return forward();  // legal no-op (and context initialization) in CUDA
  // A free during a capture that forbids it fails in CUDA, frees nothing, and invalidates the
  // capture; a pooled block must get the same answer (and stay live).
  if (!stream_ordered && api == FreeApi::kDevice && capture_forbids_unsafe_call()) {
    if (in_runtime_hook()) set_runtime_last_error(cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;
  }
  // Blocks of pools that keep their records: found, and their figures moved, in one lock and
  // one lookup. Anything else is in the tracker.
  for (int i = 0, n = record_pool_count_.load(std::memory_order_acquire); i < n; ++i) {
    DeviceState* d = record_pools_[i].load(std::memory_order_acquire);
    PooledFree hooks(d->counters, d->pooled_sites, tracker_, api == FreeApi::kHost);
    const CUresult r = d->pool->deallocate_with(ptr, stream, stream_ordered, hooks);
    if (r == CUDA_ERROR_NOT_FOUND) continue;
    if (r == CUDA_ERROR_NOT_PERMITTED) return mismatched_pooled_free(d, ptr, stream, stream_ordered, forward);
    if (r != CUDA_SUCCESS) return to_runtime_error(r);
    if (reported_.load(std::memory_order_relaxed)) late_frees_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t now = record_time_ns();
    if (trace_) trace_free(now, reinterpret_cast<uintptr_t>(ptr), hooks.record(), stream, stream_ordered);
    recent_frees_.record(reinterpret_cast<uintptr_t>(ptr), hooks.record().size, hooks.record().stack,
                         current_hook_caller());
    maybe_sample(now);
    return cudaSuccess;
  }
  AllocationRecord rec;
  // Forget the pointer before the real free: once CUDA frees it, another thread may be handed the
  // same address and must be able to record it.
  if (!untrack(reinterpret_cast<uintptr_t>(ptr), &rec)) return unknown_free(ptr, forward);
  if ((api == FreeApi::kHost) != (rec.kind == MemoryKind::kHost)) return mismatched_free(ptr, rec, forward);
  if (reported_.load(std::memory_order_relaxed)) late_frees_.fetch_add(1, std::memory_order_relaxed);
  // Forwarded frees are timed before CUDA releases the memory: once it does, another thread may
  // be handed the same address, and its alloc event must come after this free in the trace.
  // (Pooled ones are ordered by the pool itself; see trace/trace_ordered_resource.h.)
  const uint64_t free_t = trace_ && rec.route == Route::kForwarded ? now_ns() : 0;
  if (rec.route == Route::kPooled) {
    const CUresult r = device(rec.device)->pool->deallocate(ptr, stream, stream_ordered);
    if (r != CUDA_SUCCESS) {
      retrack(reinterpret_cast<uintptr_t>(ptr), rec);
      return to_runtime_error(r);
    }
  } else {
    const cudaError_t err = forward();
    if (err != cudaSuccess) {
      retrack(reinterpret_cast<uintptr_t>(ptr), rec);
      return err;
    }
    if (on_device(rec.kind)) device(rec.device)->budget.uncharge(rec.size);
  }
  count_free(rec);
  recent_frees_.record(reinterpret_cast<uintptr_t>(ptr), rec.size, rec.stack, current_hook_caller());
  const uint64_t now = record_time_ns();
  if (trace_) trace_free(rec.route == Route::kForwarded ? free_t : now, reinterpret_cast<uintptr_t>(ptr), rec, stream,
                         stream_ordered);
  maybe_sample(now);
  return cudaSuccess;
}

template <typename Append>
void Shim::take_samples(Append&& append) {
  usage_.request();  // the driver's view of usage follows the same clock (after_hook)
  const uint64_t t = now_ns() - start_ns_;
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (!d) continue;
    append(Sample{t, static_cast<int16_t>(d->ordinal), d->counters.live_bytes(), pool_figures(d).reserved_bytes});
  }
  sample_sites(t);
}

template <typename Forward>
cudaError_t Shim::mismatched_free(void* ptr, const AllocationRecord& rec, Forward&& forward) {
  // cudaFreeHost of device memory, or cudaFree of pinned host memory: CUDA refuses it and keeps
  // the memory, so the record stays. Should CUDA accept it after all, the memory is gone.
  retrack(reinterpret_cast<uintptr_t>(ptr), rec);
  const cudaError_t err = forward();
  AllocationRecord gone;
  if (err == cudaSuccess && untrack(reinterpret_cast<uintptr_t>(ptr), &gone)) count_free(gone);
  return err;
}

template <typename Forward>
cudaError_t Shim::mismatched_pooled_free(DeviceState* d, void* ptr, CUstream stream, bool stream_ordered,
                                         Forward&& forward) {
  // As mismatched_free, for a block whose record its pool keeps: the block stays live while CUDA
  // answers. Should CUDA accept the free after all, the allocation is over: it goes back to the
  // pool with its figures, as a free by the right function would.
  const cudaError_t err = forward();
  if (err == cudaSuccess) {
    PooledFree hooks(d->counters, d->pooled_sites, tracker_, /*host_api=*/false);
    if (d->pool->deallocate_with(ptr, stream, stream_ordered, hooks) == CUDA_SUCCESS && trace_)
      trace_free(record_time_ns(), reinterpret_cast<uintptr_t>(ptr), hooks.record(), stream, stream_ordered);
  }
  return err;
}

inline void Shim::count_free(const AllocationRecord& rec) {
  MemoryCounters& counters = counters_for(rec.kind, rec.device);
  under_device_lock(rec.kind, rec.device, [&] { counters.on_free(rec.size, rec.requested); });
}

template <typename F>
void Shim::under_device_lock(MemoryKind kind, int device, F&& f) const {
  const DeviceState* d = kind == MemoryKind::kDevice && record_pool_count_.load(std::memory_order_relaxed) != 0
                             ? existing_device(device)
                             : nullptr;
  if (d != nullptr && d->pool_keeps_records) d->pool->with_lock(f);
  else f();
}

template <typename Forward>
cudaError_t Shim::unknown_free(void* ptr, Forward&& forward) {
  // Inside memory a pool holds: a double free or an interior pointer. Forwarding could free a
  // whole segment under other live blocks, so refuse it.
  if (pool_contains(ptr)) {
    warn_invalid_free(ptr, "a double free, or a pointer inside a block");
    // Only the runtime keeps a last error: a refused cuMemFree must leave the runtime's untouched.
    if (in_runtime_hook()) set_runtime_last_error(cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  // Possibly memory from a path we did not see (the driver API); CUDA decides.
  const cudaError_t err = forward();
  if (err != cudaSuccess) warn_invalid_free(ptr, "not a live CUDA allocation");
  return err;
}

}  // namespace gpushim
