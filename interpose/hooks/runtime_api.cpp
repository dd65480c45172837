// CUDA runtime entry points. Each hook only translates the call into a call on the core (Shim)
// and tells it how to forward to the real libcudart when the policy does not serve the call.
//
// Our definitions are unversioned; glibc binds an application's `cudaMalloc@libcudart.so.13`
// reference to them anyway because LD_PRELOAD objects come first (design-notes §1).
#include <cuda_runtime_api.h>

#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/error_codes.h"
#include "cuda/real_symbols.h"

#include "hooks/export.h"
// Marks the thread as inside a runtime hook (the driver calls the real runtime makes for us are
// then only forwarded) and notes who called, for attribution by module.
#define GPUSHIM_SCOPE gpushim::CallScope scope(gpushim::HookApi::kRuntime, __builtin_return_address(0))

using gpushim::MemoryKind;
using gpushim::real_runtime;
using gpushim::Shim;

namespace {

// Runtime calls with no real libcudart behind them (nothing to forward to).
cudaError_t missing() { return cudaErrorInitializationError; }

// Pitch rows are aligned like the real runtime's (cudaDeviceProp::texturePitchAlignment is 512
// on every current GPU), so pooled pitched memory is laid out exactly as CUDA would lay it out.
constexpr size_t kPitchAlignment = 512;

int current_device() {
  int dev = 0;
  if (real_runtime().cudaGetDevice) real_runtime().cudaGetDevice(&dev);
  return dev;
}

}  // namespace

GPUSHIM_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return real_runtime().cudaMalloc ? real_runtime().cudaMalloc(devPtr, size) : missing(); };
  Shim* s = Shim::get();
  if (!s) return forward();
  return s->device_alloc(devPtr, size, size, nullptr, false, forward);
}

GPUSHIM_EXPORT cudaError_t cudaFree(void* devPtr) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return real_runtime().cudaFree ? real_runtime().cudaFree(devPtr) : missing(); };
  Shim* s = Shim::get();
  if (!s) return forward();
  return s->deallocate(devPtr, nullptr, false, forward);
}

GPUSHIM_EXPORT cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  GPUSHIM_SCOPE;
  auto forward = [&] {
    return real_runtime().cudaMallocAsync ? real_runtime().cudaMallocAsync(devPtr, size, stream) : missing();
  };
  Shim* s = Shim::get();
  if (!s) return forward();
  return s->device_alloc(devPtr, size, size, reinterpret_cast<CUstream>(stream), true, forward);
}

GPUSHIM_EXPORT cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream) {
  GPUSHIM_SCOPE;
  auto forward = [&] {
    return real_runtime().cudaMallocAsync_ptsz ? real_runtime().cudaMallocAsync_ptsz(devPtr, size, stream)
                                               : missing();
  };
  Shim* s = Shim::get();
  if (!s) return forward();
  // The per-thread default stream is what stream 0 means to a _ptsz caller.
  CUstream st = stream ? reinterpret_cast<CUstream>(stream) : CU_STREAM_PER_THREAD;
  return s->device_alloc(devPtr, size, size, st, true, forward);
}

GPUSHIM_EXPORT cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return real_runtime().cudaFreeAsync ? real_runtime().cudaFreeAsync(devPtr, stream) : missing(); };
  Shim* s = Shim::get();
  if (!s) return forward();
  return s->deallocate(devPtr, reinterpret_cast<CUstream>(stream), true, forward);
}

GPUSHIM_EXPORT cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream) {
  GPUSHIM_SCOPE;
  auto forward = [&] {
    return real_runtime().cudaFreeAsync_ptsz ? real_runtime().cudaFreeAsync_ptsz(devPtr, stream) : missing();
  };
  Shim* s = Shim::get();
  if (!s) return forward();
  CUstream st = stream ? reinterpret_cast<CUstream>(stream) : CU_STREAM_PER_THREAD;
  return s->deallocate(devPtr, st, true, forward);
}

GPUSHIM_EXPORT cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  GPUSHIM_SCOPE;
  auto forward = [&] {
    return real_runtime().cudaMallocPitch ? real_runtime().cudaMallocPitch(devPtr, pitch, width, height) : missing();
  };
  Shim* s = Shim::get();
  if (!s || pitch == nullptr || devPtr == nullptr) return forward();
  const size_t row = (width + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
  // Under passthrough the real runtime picks the pitch, so the size is known only afterwards; so
  // it is for empty or impossible shapes (a row that cannot be rounded, a size past 2^64), which
  // CUDA decides under every policy.
  const bool impossible = width != 0 && height != 0 && (row < width || row > SIZE_MAX / height);
  if (s->config().policy == gpushim::PolicyKind::kPassthrough || width == 0 || height == 0 || impossible) {
    size_t requested = 0;
    if (__builtin_mul_overflow(width, height, &requested)) requested = SIZE_MAX;
    // An impossible shape is refused for its arguments: GPUSHIM_FAIL never turns that into out of
    // memory, nor counts it as an allocation.
    const gpushim::ForwardedAlloc a{.size = requested, .requested = width * height, .size_known_after = true,
                                    .injectable = !impossible};
    // Past the cap, what CUDA made is freed again and the caller gets an out-of-memory error.
    return s->forward_alloc(
        a, forward, [&] { return gpushim::MadeAlloc{reinterpret_cast<uintptr_t>(*devPtr), *pitch * height}; },
        [](uintptr_t p) {
          if (real_runtime().cudaFree) real_runtime().cudaFree(reinterpret_cast<void*>(p));
        });
  }
  *pitch = row;
  return s->device_alloc(devPtr, row * height, width * height, nullptr, false, forward);
}

GPUSHIM_EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  GPUSHIM_SCOPE;
  Shim* s = Shim::get();
  if (!s) return real_runtime().cudaMemGetInfo ? real_runtime().cudaMemGetInfo(free, total) : missing();
  const cudaError_t err = s->mem_get_info(free, total);
  if (err == cudaSuccess) s->sample_usage_now();
  return err;
}

GPUSHIM_EXPORT cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  GPUSHIM_SCOPE;
  if (!real_runtime().cudaMallocManaged) return missing();
  auto forward = [&] { return real_runtime().cudaMallocManaged(devPtr, size, flags); };
  Shim* s = Shim::get();
  if (!s || devPtr == nullptr) return forward();
  const gpushim::ForwardedAlloc a{.kind = MemoryKind::kManaged, .device = current_device(), .size = size,
                                  .requested = size};
  return s->forward_alloc(a, forward, [&] { return reinterpret_cast<uintptr_t>(*devPtr); });
}

GPUSHIM_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
  GPUSHIM_SCOPE;
  if (!real_runtime().cudaMallocHost) return missing();
  auto forward = [&] { return real_runtime().cudaMallocHost(ptr, size); };
  Shim* s = Shim::get();
  if (!s || ptr == nullptr) return forward();
  const gpushim::ForwardedAlloc a{.kind = MemoryKind::kHost, .device = 0, .size = size, .requested = size};
  return s->forward_alloc(a, forward, [&] { return reinterpret_cast<uintptr_t>(*ptr); });
}

GPUSHIM_EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  GPUSHIM_SCOPE;
  if (!real_runtime().cudaHostAlloc) return missing();
  auto forward = [&] { return real_runtime().cudaHostAlloc(pHost, size, flags); };
  Shim* s = Shim::get();
  if (!s || pHost == nullptr) return forward();
  const gpushim::ForwardedAlloc a{.kind = MemoryKind::kHost, .device = 0, .size = size, .requested = size};
  return s->forward_alloc(a, forward, [&] { return reinterpret_cast<uintptr_t>(*pHost); });
}

GPUSHIM_EXPORT cudaError_t cudaFreeHost(void* ptr) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return real_runtime().cudaFreeHost ? real_runtime().cudaFreeHost(ptr) : missing(); };
  Shim* s = Shim::get();
  if (!s) return forward();
  return s->deallocate(ptr, nullptr, false, forward, gpushim::FreeApi::kHost);
}

// Runs after every atexit handler: writes the report if exit() did not (e.g. the library was
// dlclose'd) and notes frees that arrived after the report.
__attribute__((destructor)) static void gpushim_unload() {
  if (Shim* s = Shim::existing()) s->on_unload();
}
