// CUDA driver entry points. Reached three ways, all of them ours: a direct call to the exported
// symbol (programs and libraries linked with -lcuda: JAX/XLA, TensorFlow), dlsym on a libcuda
// handle (hooks/dlsym.cpp), and cuGetProcAddress (hooks/proc_address.cpp), which is how libcudart
// and libraries carrying their own copy of it (NCCL, cuBLAS, cuDNN) reach the driver.
//
// Each hook forwards to the real driver and tells the core what happened. When one of our runtime
// hooks is on the stack, the call is the real libcudart serving it (cudaMalloc is cuMemAlloc_v2
// underneath): the runtime hook accounts it, so the driver hook only forwards.
#define __CUDA_API_VERSION_INTERNAL 1  // every variant (_v2, _ptsz) under its real name
#include <cuda.h>

#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/real_driver.h"
#include "hooks/driver_hook.h"

using gpushim::MemoryKind;
using gpushim::real_driver;
using gpushim::Shim;
using gpushim::driver_hook::accounting;
using gpushim::driver_hook::call;

namespace {

// Whether `stream` is capturing a graph: allocations there are graph memory, owned by the graph.
bool capturing(CUstream stream, bool per_thread) {
  const gpushim::RealDriver& d = real_driver();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = per_thread ? call(d.cuStreamIsCapturing_ptsz, stream, &status)
                                : call(d.cuStreamIsCapturing, stream, &status);
  return r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

CUresult alloc_async(CUdeviceptr* dptr, size_t size, CUstream stream, bool per_thread,
                     const gpushim::CallScope& scope) {
  const gpushim::RealDriver& d = real_driver();
  auto forward = [&] {
    return per_thread ? call(d.cuMemAllocAsync_ptsz, dptr, size, stream) : call(d.cuMemAllocAsync, dptr, size, stream);
  };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return forward();
  const MemoryKind kind = capturing(stream, per_thread) ? MemoryKind::kGraph : MemoryKind::kDevice;
  return s->driver_alloc(kind, -1, size, size, forward, [&] { return *dptr; });
}

CUresult alloc_from_pool_async(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream, bool per_thread,
                               const gpushim::CallScope& scope) {
  const gpushim::RealDriver& d = real_driver();
  const CUresult r = per_thread ? call(d.cuMemAllocFromPoolAsync_ptsz, dptr, size, pool, stream)
                                : call(d.cuMemAllocFromPoolAsync, dptr, size, pool, stream);
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return r;
  // The pool decides the device, which is known only from the memory it returned.
  int device = -1;
  if (r == CUDA_SUCCESS && call(d.cuPointerGetAttribute, static_cast<void*>(&device),
                                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, *dptr) != CUDA_SUCCESS)
    return r;
  if (r != CUDA_SUCCESS) {
    if (gpushim::current_context_device(&device)) s->driver_failure(MemoryKind::kDevice, device, r, size);
    return r;
  }
  const MemoryKind kind = capturing(stream, per_thread) ? MemoryKind::kGraph : MemoryKind::kDevice;
  return s->account_after(kind, device, *dptr, size, size, [&] {
    per_thread ? call(d.cuMemFreeAsync_ptsz, *dptr, stream) : call(d.cuMemFreeAsync, *dptr, stream);
  });
}

CUresult free_async(CUdeviceptr dptr, CUstream stream, bool per_thread, const gpushim::CallScope& scope) {
  const gpushim::RealDriver& d = real_driver();
  auto forward = [&] {
    return per_thread ? call(d.cuMemFreeAsync_ptsz, dptr, stream) : call(d.cuMemFreeAsync, dptr, stream);
  };
  Shim* s = accounting(scope);
  if (!s) return forward();
  // The per-thread default stream is what stream 0 means to a _ptsz caller.
  CUstream st = (per_thread && stream == nullptr) ? CU_STREAM_PER_THREAD : stream;
  return s->driver_free(reinterpret_cast<void*>(dptr), st, true, forward);
}

}  // namespace

// ---- device, managed and pinned host memory ----

GPUSHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemAlloc_v2, dptr, bytesize); };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return forward();
  return s->driver_alloc(MemoryKind::kDevice, -1, bytesize, bytesize, forward, [&] { return *dptr; });
}

GPUSHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemFree_v2, dptr); };
  Shim* s = accounting(scope);
  if (!s) return forward();
  return s->driver_free(reinterpret_cast<void*>(dptr), nullptr, false, forward);
}

GPUSHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                           unsigned int ElementSizeBytes) {
  GPUSHIM_SCOPE;
  Shim* s = accounting(scope);
  int device = 0;
  const bool ours = s && dptr != nullptr && pPitch != nullptr && gpushim::current_context_device(&device);
  // GPUSHIM_FAIL, asked before the call (the pitch is known only after it); arguments CUDA refuses
  // get CUDA's own answer.
  uint64_t asked = 0;
  if (ours && WidthInBytes != 0 && Height != 0 &&
      (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16)) {
    if (__builtin_mul_overflow(static_cast<uint64_t>(WidthInBytes), static_cast<uint64_t>(Height), &asked))
      asked = UINT64_MAX;
    if (const CUresult injected = s->driver_inject_if_chosen(device, asked); injected != CUDA_SUCCESS)
      return injected;
  }
  const CUresult r = call(real_driver().cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  if (!ours) return r;
  // The driver picks the pitch: the size is known only now.
  if (r != CUDA_SUCCESS) {
    s->driver_failure(MemoryKind::kDevice, device, r, WidthInBytes * Height);
    return r;
  }
  return s->account_after(MemoryKind::kDevice, device, *dptr, *pPitch * Height, WidthInBytes * Height,
                          [&] { call(real_driver().cuMemFree_v2, *dptr); });
}

GPUSHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemAllocManaged, dptr, bytesize, flags); };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return forward();
  return s->driver_alloc(MemoryKind::kManaged, -1, bytesize, bytesize, forward, [&] { return *dptr; });
}

GPUSHIM_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemHostAlloc, pp, bytesize, Flags); };
  Shim* s = accounting(scope);
  if (!s || pp == nullptr) return forward();
  return s->driver_alloc(MemoryKind::kHost, -1, bytesize, bytesize, forward,
                         [&] { return reinterpret_cast<uintptr_t>(*pp); });
}

GPUSHIM_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemAllocHost_v2, pp, bytesize); };
  Shim* s = accounting(scope);
  if (!s || pp == nullptr) return forward();
  return s->driver_alloc(MemoryKind::kHost, -1, bytesize, bytesize, forward,
                         [&] { return reinterpret_cast<uintptr_t>(*pp); });
}

GPUSHIM_EXPORT CUresult cuMemFreeHost(void* p) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemFreeHost, p); };
  Shim* s = accounting(scope);
  if (!s) return forward();
  return s->driver_free(p, nullptr, false, forward, gpushim::FreeApi::kHost);
}

// ---- stream-ordered allocation ----

GPUSHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  GPUSHIM_SCOPE;
  return alloc_async(dptr, bytesize, hStream, false, scope);
}

GPUSHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  GPUSHIM_SCOPE;
  return alloc_async(dptr, bytesize, hStream, true, scope);
}

GPUSHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
  GPUSHIM_SCOPE;
  return alloc_from_pool_async(dptr, bytesize, pool, hStream, false, scope);
}

GPUSHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                     CUstream hStream) {
  GPUSHIM_SCOPE;
  return alloc_from_pool_async(dptr, bytesize, pool, hStream, true, scope);
}

GPUSHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  GPUSHIM_SCOPE;
  return free_async(dptr, hStream, false, scope);
}

GPUSHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  GPUSHIM_SCOPE;
  return free_async(dptr, hStream, true, scope);
}

// ---- graph memory ----

GPUSHIM_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                               const CUgraphNode* dependencies, size_t numDependencies,
                                               CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  GPUSHIM_SCOPE;
  auto forward = [&] {
    return call(real_driver().cuGraphAddMemAllocNode, phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  };
  Shim* s = accounting(scope);
  if (!s || nodeParams == nullptr || nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return forward();
  return s->driver_alloc(MemoryKind::kGraph, nodeParams->poolProps.location.id, nodeParams->bytesize,
                         nodeParams->bytesize, forward, [&] { return nodeParams->dptr; });
}

// ---- capacity ----

GPUSHIM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  GPUSHIM_SCOPE;
  // The real call first, with the caller's pointers, so that CUDA decides every error code.
  const CUresult r = call(real_driver().cuMemGetInfo_v2, free, total);
  Shim* s = accounting(scope);
  if (r == CUDA_SUCCESS && s) {
    s->cap_driver_mem_info(free, total);
    s->sample_usage_now();
  }
  return r;
}
