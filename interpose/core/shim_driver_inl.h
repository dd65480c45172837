// Templates of Shim for the driver hooks (included from shim.h): allocations the driver API makes,
// forwarded to CUDA and accounted like any other, and frees that may concern pooled blocks.
#pragma once

#include "cuda/error_codes.h"
#include "cuda/real_driver.h"
#include "util/clock.h"

namespace gpushim {

template <typename Forward, typename Result>
CUresult Shim::driver_alloc(MemoryKind kind, int device, uint64_t size, uint64_t requested, Forward&& forward,
                            Result&& result) {
  if (on_device(kind) && device < 0 && !current_context_device(&device)) return forward();  // no context: CUDA says
  DeviceState* d = on_device(kind) ? this->device(device) : nullptr;
  if (on_device(kind) && d == nullptr) return forward();
  if (kind == MemoryKind::kDevice)
    if (const CUresult injected = driver_inject_if_chosen(device, size); injected != CUDA_SUCCESS) return injected;
  const StackId stack = capture_stack();
  // Memory the driver charges to the device counts against the cap like a pool's segments.
  if (d && !d->budget.try_charge(size)) {
    d->counters.on_failed();
    on_oom(d, size, stack);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult r = forward();
  const uintptr_t ptr = r == CUDA_SUCCESS ? static_cast<uintptr_t>(result()) : 0;
  if (r != CUDA_SUCCESS || ptr == 0) {
    if (d) d->budget.cancel(size);
    if (r != CUDA_SUCCESS && !is_argument_error(r)) {
      if (d) d->counters.on_failed();
      else record_failure(kind, device);
      if (d && r == CUDA_ERROR_OUT_OF_MEMORY) on_oom(d, size, stack);
    }
    return r;
  }
  if (d) d->budget.commit(size);
  const uint64_t t = now_ns();
  const AllocationRecord rec{size, requested, t, stack, static_cast<int16_t>(device), kind,
                             Route::kForwarded, caller_module()};
  // Into the trace too: its frees are recorded by deallocate(), and a trace without the allocations
  // undercounts every library that allocates through the driver API.
  if (track(ptr, rec) && trace_) trace_alloc(ptr, rec, size, nullptr, false);
  maybe_sample(t);
  return r;
}

template <typename Undo>
CUresult Shim::account_after(MemoryKind kind, int device, uintptr_t ptr, uint64_t size, uint64_t requested,
                             Undo&& undo) {
  if (ptr == 0) return CUDA_SUCCESS;
  DeviceState* d = on_device(kind) ? this->device(device) : nullptr;
  if (on_device(kind) && d == nullptr) return CUDA_SUCCESS;
  const StackId stack = capture_stack();
  if (d && !d->budget.try_charge(size)) {
    undo();
    d->counters.on_failed();
    on_oom(d, size, stack);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (d) d->budget.commit(size);  // the memory exists already
  const uint64_t t = now_ns();
  const AllocationRecord rec{size, requested, t, stack, static_cast<int16_t>(device), kind,
                             Route::kForwarded, caller_module()};
  // Into the trace too: its frees are recorded by deallocate(), and a trace without the allocations
  // undercounts every library that allocates through the driver API.
  if (track(ptr, rec) && trace_) trace_alloc(ptr, rec, size, nullptr, false);
  maybe_sample(t);
  return CUDA_SUCCESS;
}

template <typename Forward>
CUresult Shim::driver_free(void* ptr, CUstream stream, bool stream_ordered, Forward&& forward, FreeApi api) {
  // deallocate() speaks the runtime's error codes; keep the driver's own answer when it forwards.
  bool forwarded = false;
  CUresult real = CUDA_SUCCESS;
  const cudaError_t err = deallocate(ptr, stream, stream_ordered, [&] {
    forwarded = true;
    real = forward();
    return real == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
  }, api);
  if (forwarded) return real;
  return err == cudaSuccess ? CUDA_SUCCESS : to_driver_error(err);
}

}  // namespace gpushim
