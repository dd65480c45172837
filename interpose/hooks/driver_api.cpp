// CUDA driver entry points. Reached three ways, all of them ours: a direct call to the exported
// symbol (programs and libraries linked with -lcuda: JAX/XLA, TensorFlow), dlsym on a libcuda
// handle (front/front_dlsym.cpp), and cuGetProcAddress (hooks/proc_address.cpp), which is how libcudart
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

using gpushim::ForwardedAlloc;
using gpushim::MadeAlloc;
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
  // CUDA allocates on the stream's device, which a created stream of another device is not the
  // current one: booked (and capped) there, as cudaMallocAsync is.
  return s->forward_alloc(ForwardedAlloc{.kind = kind, .device = s->device_ordering(stream, per_thread), .size = size,
                                         .requested = size, .cuda_pool = kind == MemoryKind::kDevice},
                          forward, [&] { return *dptr; });
}

CUresult alloc_from_pool_async(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream, bool per_thread,
                               const gpushim::CallScope& scope) {
  const gpushim::RealDriver& d = real_driver();
  auto forward = [&] {
    return per_thread ? call(d.cuMemAllocFromPoolAsync_ptsz, dptr, size, pool, stream)
                      : call(d.cuMemAllocFromPoolAsync, dptr, size, pool, stream);
  };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return forward();
  const MemoryKind kind = capturing(stream, per_thread) ? MemoryKind::kGraph : MemoryKind::kDevice;
  // The pool decides the device, which is known only from the memory it returned.
  const ForwardedAlloc a{.kind = kind, .size = size, .requested = size, .size_known_after = true,
                         .device_known_after = true, .cuda_pool = kind == MemoryKind::kDevice, .pool = pool};
  auto made = [&] {
    int device = -1;
    if (call(d.cuPointerGetAttribute, static_cast<void*>(&device), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, *dptr) !=
        CUDA_SUCCESS)
      return MadeAlloc{};
    return MadeAlloc{*dptr, size, device};
  };
  auto undo = [&](uintptr_t p) {
    per_thread ? call(d.cuMemFreeAsync_ptsz, p, stream) : call(d.cuMemFreeAsync, p, stream);
  };
  return s->forward_alloc(a, forward, made, undo);
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
  return s->deallocate(reinterpret_cast<void*>(dptr), st, true, forward);
}

}  // namespace

// ---- device, managed and pinned host memory ----

GPUSHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemAlloc_v2, dptr, bytesize); };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return forward();
  return s->forward_alloc(ForwardedAlloc{.size = bytesize, .requested = bytesize}, forward, [&] { return *dptr; });
}

GPUSHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemFree_v2, dptr); };
  Shim* s = accounting(scope);
  if (!s) return forward();
  return s->deallocate(reinterpret_cast<void*>(dptr), nullptr, false, forward);
}

GPUSHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                           unsigned int ElementSizeBytes) {
  GPUSHIM_SCOPE;
  auto forward = [&] {
    return call(real_driver().cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr || pPitch == nullptr) return forward();
  // The driver picks the pitch: the size is known only after the call. GPUSHIM_FAIL is asked
  // with the caller's size; arguments CUDA refuses (size 0 here) get CUDA's own answer.
  // A shape whose size does not fit 64 bits is CUDA's to refuse for its arguments: never an
  // allocation GPUSHIM_FAIL fails or counts.
  uint64_t asked = 0;
  bool impossible = false;
  if (WidthInBytes != 0 && Height != 0 && (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16) &&
      __builtin_mul_overflow(static_cast<uint64_t>(WidthInBytes), static_cast<uint64_t>(Height), &asked)) {
    asked = UINT64_MAX;
    impossible = true;
  }
  const ForwardedAlloc a{.size = asked, .requested = WidthInBytes * Height, .size_known_after = true,
                         .injectable = !impossible};
  return s->forward_alloc(a, forward, [&] { return MadeAlloc{*dptr, *pPitch * Height}; },
                          [&](uintptr_t p) { call(real_driver().cuMemFree_v2, p); });
}

GPUSHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemAllocManaged, dptr, bytesize, flags); };
  Shim* s = accounting(scope);
  if (!s || dptr == nullptr) return forward();
  return s->forward_alloc(ForwardedAlloc{.kind = MemoryKind::kManaged, .size = bytesize, .requested = bytesize},
                          forward, [&] { return *dptr; });
}

GPUSHIM_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemHostAlloc, pp, bytesize, Flags); };
  Shim* s = accounting(scope);
  if (!s || pp == nullptr) return forward();
  return s->forward_alloc(ForwardedAlloc{.kind = MemoryKind::kHost, .size = bytesize, .requested = bytesize},
                          forward, [&] { return reinterpret_cast<uintptr_t>(*pp); });
}

GPUSHIM_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemAllocHost_v2, pp, bytesize); };
  Shim* s = accounting(scope);
  if (!s || pp == nullptr) return forward();
  return s->forward_alloc(ForwardedAlloc{.kind = MemoryKind::kHost, .size = bytesize, .requested = bytesize},
                          forward, [&] { return reinterpret_cast<uintptr_t>(*pp); });
}

GPUSHIM_EXPORT CUresult cuMemFreeHost(void* p) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemFreeHost, p); };
  Shim* s = accounting(scope);
  if (!s) return forward();
  return s->deallocate(p, nullptr, false, forward, gpushim::FreeApi::kHost);
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
  const ForwardedAlloc a{.kind = MemoryKind::kGraph, .device = nodeParams->poolProps.location.id,
                         .size = nodeParams->bytesize, .requested = nodeParams->bytesize};
  return s->forward_alloc(a, forward, [&] { return nodeParams->dptr; });
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
