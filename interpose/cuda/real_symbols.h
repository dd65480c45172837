// The real CUDA entry points that our hooks forward to, resolved once with the real dlsym.
//
// We never link libcudart or libcuda: runtime functions come from RTLD_NEXT (the libcudart the
// process loaded), driver functions from dlopen("libcuda.so.1") (design-notes §1).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>

struct GpushimFront;  // front/front_api.h

namespace gpushim {

// Code that our dlsym runs before it reaches glibc's. The first dlsym calls of a process can come
// from a sanitizer runtime's start-up (ASan and TSan find the functions they intercept with
// dlsym(RTLD_NEXT)), before its shadow memory exists: this code must carry no instrumentation.
// no_sanitize("thread") still leaves TSan's function entry/exit hooks, which crash before TSan is
// initialized; clang's disable_sanitizer_instrumentation removes those too (gcc lacks it).
#if defined(__has_attribute)
#if __has_attribute(disable_sanitizer_instrumentation)
#define GPUSHIM_NO_INSTRUMENTATION disable_sanitizer_instrumentation,
#endif
#endif
#ifndef GPUSHIM_NO_INSTRUMENTATION
#define GPUSHIM_NO_INSTRUMENTATION
#endif
#define GPUSHIM_EARLY __attribute__((GPUSHIM_NO_INSTRUMENTATION no_sanitize("address", "thread", "undefined")))

// glibc's own dlsym, never our interposed one (taken with dlvsym so that interposing dlsym in
// this library cannot recurse into itself).
GPUSHIM_EARLY void* real_dlsym(void* handle, const char* name);
// That function itself; never an interposed one.
GPUSHIM_EARLY void* real_dlsym_function();

// Loaded by the preload front (front/front_api.h): glibc's dlsym and the runtime come through it
// from now on. Called before any hook runs.
void attach_front(const GpushimFront* front);

// pthread_atfork, through the front once attached (front/front_api.h says why).
int register_fork_handlers(void (*prepare)(), void (*parent)(), void (*child)());

struct RealRuntime {
  cudaError_t (*cudaMalloc)(void**, size_t) = nullptr;
  cudaError_t (*cudaFree)(void*) = nullptr;
  cudaError_t (*cudaMallocAsync)(void**, size_t, cudaStream_t) = nullptr;
  cudaError_t (*cudaMallocAsync_ptsz)(void**, size_t, cudaStream_t) = nullptr;
  cudaError_t (*cudaFreeAsync)(void*, cudaStream_t) = nullptr;
  cudaError_t (*cudaFreeAsync_ptsz)(void*, cudaStream_t) = nullptr;
  cudaError_t (*cudaMallocPitch)(void**, size_t*, size_t, size_t) = nullptr;
  cudaError_t (*cudaMallocManaged)(void**, size_t, unsigned) = nullptr;
  cudaError_t (*cudaMallocHost)(void**, size_t) = nullptr;
  cudaError_t (*cudaHostAlloc)(void**, size_t, unsigned) = nullptr;
  cudaError_t (*cudaFreeHost)(void*) = nullptr;
  cudaError_t (*cudaMemGetInfo)(size_t*, size_t*) = nullptr;
  cudaError_t (*cudaGetDevice)(int*) = nullptr;
  cudaError_t (*cudaSetDevice)(int) = nullptr;
  cudaError_t (*cudaStreamIsCapturing)(cudaStream_t, cudaStreamCaptureStatus*) = nullptr;
  cudaError_t (*cudaIpcGetMemHandle)(cudaIpcMemHandle_t*, void*) = nullptr;
  cudaError_t (*cudaMemPoolGetAttribute)(cudaMemPool_t, cudaMemPoolAttr, void*) = nullptr;
  cudaError_t (*cudaMemPoolSetAttribute)(cudaMemPool_t, cudaMemPoolAttr, void*) = nullptr;
  cudaError_t (*cudaMemPoolTrimTo)(cudaMemPool_t, size_t) = nullptr;
  cudaError_t (*cudaDeviceSetMemPool)(int, cudaMemPool_t) = nullptr;
  cudaError_t (*cudaDeviceReset)() = nullptr;
  const char* (*cudaGetErrorName)(cudaError_t) = nullptr;  // for the lines the shim prints
};

// Resolved on first use (thread-safe). Entries are null while libcudart is not loaded; it is then
// looked for again on later calls. Inline: every runtime hook reads it, most several times.
extern std::atomic<const RealRuntime*> g_real_runtime;  // set once resolved
const RealRuntime& resolve_real_runtime();
inline const RealRuntime& real_runtime() {
  if (const RealRuntime* t = g_real_runtime.load(std::memory_order_acquire)) return *t;
  return resolve_real_runtime();
}

}  // namespace gpushim
