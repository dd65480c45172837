// Memory management: allocation, copies, memsets, memory pools.
//
// The _ptsz / _ptds entry points (what code built with --default-stream per-thread calls) use the
// driver's per-thread variants, obtained with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.
#include "runtime.h"

using namespace fakecudart;

namespace {

CUdeviceptr Dev(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// Allocation results are written only on success, like CUDA.
template <typename T>
void Store(T** out, CUdeviceptr p) {
  *out = reinterpret_cast<T*>(p);
}

cudaError_t Memcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, bool ptds) {
  const DriverApi& d = Driver();
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return Call([&] { return (ptds ? d.cuMemcpyHtoD_v2_ptds : d.cuMemcpyHtoD_v2)(Dev(dst), src, count); });
    case cudaMemcpyDeviceToHost:
      return Call([&] { return (ptds ? d.cuMemcpyDtoH_v2_ptds : d.cuMemcpyDtoH_v2)(dst, Dev(src), count); });
    case cudaMemcpyDeviceToDevice:
      return Call([&] { return (ptds ? d.cuMemcpyDtoD_v2_ptds : d.cuMemcpyDtoD_v2)(Dev(dst), Dev(src), count); });
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:  // unified addressing: the driver works out the direction
      return Call([&] { return (ptds ? d.cuMemcpy_ptds : d.cuMemcpy)(Dev(dst), Dev(src), count); });
  }
  return Record(cudaErrorInvalidMemcpyDirection);
}

cudaError_t MemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream,
                        bool ptsz) {
  const DriverApi& d = Driver();
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return Call([&] {
        return (ptsz ? d.cuMemcpyHtoDAsync_v2_ptsz : d.cuMemcpyHtoDAsync_v2)(Dev(dst), src, count, stream);
      });
    case cudaMemcpyDeviceToHost:
      return Call([&] {
        return (ptsz ? d.cuMemcpyDtoHAsync_v2_ptsz : d.cuMemcpyDtoHAsync_v2)(dst, Dev(src), count, stream);
      });
    case cudaMemcpyDeviceToDevice:
      return Call([&] {
        return (ptsz ? d.cuMemcpyDtoDAsync_v2_ptsz : d.cuMemcpyDtoDAsync_v2)(Dev(dst), Dev(src), count, stream);
      });
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return Call([&] { return (ptsz ? d.cuMemcpyAsync_ptsz : d.cuMemcpyAsync)(Dev(dst), Dev(src), count, stream); });
  }
  return Record(cudaErrorInvalidMemcpyDirection);
}

cudaError_t MallocAsync(void** devPtr, size_t size, cudaStream_t stream, bool ptsz) {
  if (devPtr == nullptr) return Record(cudaErrorInvalidValue);
  CUdeviceptr p = 0;
  cudaError_t e = Call([&] {
    return (ptsz ? Driver().cuMemAllocAsync_ptsz : Driver().cuMemAllocAsync)(&p, size, stream);
  });
  if (e == cudaSuccess) Store(devPtr, p);
  return e;
}

cudaError_t MallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream, bool ptsz) {
  if (ptr == nullptr) return Record(cudaErrorInvalidValue);
  CUdeviceptr p = 0;
  cudaError_t e = Call([&] {
    return (ptsz ? Driver().cuMemAllocFromPoolAsync_ptsz : Driver().cuMemAllocFromPoolAsync)(&p, size, pool, stream);
  });
  if (e == cudaSuccess) Store(ptr, p);
  return e;
}

}  // namespace

// ---- allocation ----

cudaError_t CUDARTAPI cudaMalloc(void** devPtr, size_t size) {
  if (devPtr == nullptr) return Record(cudaErrorInvalidValue);
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  // cudaMalloc(0) succeeds with a null pointer and never reaches the driver.
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  cudaError_t e = Call([&] { return Driver().cuMemAlloc_v2(&p, size); });
  if (e == cudaSuccess) Store(devPtr, p);
  return e;
}

cudaError_t CUDARTAPI cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  if (devPtr == nullptr || pitch == nullptr) return Record(cudaErrorInvalidValue);
  CUdeviceptr p = 0;
  size_t pitch_out = 0;
  cudaError_t e = Call([&] { return Driver().cuMemAllocPitch_v2(&p, &pitch_out, width, height, 4); });
  if (e == cudaSuccess) {
    Store(devPtr, p);
    *pitch = pitch_out;
  }
  return e;
}

cudaError_t CUDARTAPI cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  if (devPtr == nullptr) return Record(cudaErrorInvalidValue);
  CUdeviceptr p = 0;
  // cudaMemAttachGlobal/Host have the CU_MEM_ATTACH_* values.
  cudaError_t e = Call([&] { return Driver().cuMemAllocManaged(&p, size, flags); });
  if (e == cudaSuccess) Store(devPtr, p);
  return e;
}

cudaError_t CUDARTAPI cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return Record(cudaErrorInvalidValue);
  return Call([&] { return Driver().cuMemHostAlloc(ptr, size, 0); });
}

cudaError_t CUDARTAPI cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (pHost == nullptr) return Record(cudaErrorInvalidValue);
  // cudaHostAlloc* flags have the CU_MEMHOSTALLOC_* values.
  return Call([&] { return Driver().cuMemHostAlloc(pHost, size, flags); });
}

cudaError_t CUDARTAPI cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  if (pDevice == nullptr) return Record(cudaErrorInvalidValue);
  CUdeviceptr p = 0;
  cudaError_t e = Call([&] { return Driver().cuMemHostGetDevicePointer_v2(&p, pHost, flags); });
  if (e == cudaSuccess) Store(pDevice, p);
  return e;
}

cudaError_t CUDARTAPI cudaFree(void* devPtr) {
  // cudaFree(nullptr) is the classic way to initialize the context; it frees nothing.
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  if (devPtr == nullptr) return cudaSuccess;
  return Call([&] { return Driver().cuMemFree_v2(Dev(devPtr)); });
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  if (ptr == nullptr) return cudaSuccess;
  return Call([&] { return Driver().cuMemFreeHost(ptr); });
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  return Call([&] { return Driver().cuMemGetInfo_v2(free, total); });
}

// ---- stream-ordered allocation ----

cudaError_t CUDARTAPI cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return MallocAsync(devPtr, size, hStream, false);
}
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  return MallocAsync(devPtr, size, hStream, true);
}
cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  return MallocFromPoolAsync(ptr, size, memPool, stream, false);
}
cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream) {
  return MallocFromPoolAsync(ptr, size, memPool, stream, true);
}
cudaError_t CUDARTAPI cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  return Call([&] { return Driver().cuMemFreeAsync(Dev(devPtr), hStream); });
}
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  return Call([&] { return Driver().cuMemFreeAsync_ptsz(Dev(devPtr), hStream); });
}

cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  return Call([&] { return Driver().cuDeviceGetDefaultMemPool(memPool, device); });
}
cudaError_t CUDARTAPI cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  return Call([&] { return Driver().cuDeviceGetMemPool(memPool, device); });
}
cudaError_t CUDARTAPI cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  return Call([&] { return Driver().cuDeviceSetMemPool(device, memPool); });
}
cudaError_t CUDARTAPI cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps* poolProps) {
  if (poolProps == nullptr) return Record(cudaErrorInvalidValue);
  // The two property structs share their leading layout; convert the fields the driver reads.
  CUmemPoolProps props{};
  props.allocType = static_cast<CUmemAllocationType>(poolProps->allocType);
  props.handleTypes = static_cast<CUmemAllocationHandleType>(poolProps->handleTypes);
  props.location.type = static_cast<CUmemLocationType>(poolProps->location.type);
  props.location.id = poolProps->location.id;
  props.maxSize = poolProps->maxSize;
  return Call([&] { return Driver().cuMemPoolCreate(memPool, &props); });
}
cudaError_t CUDARTAPI cudaMemPoolDestroy(cudaMemPool_t memPool) {
  return Call([&] { return Driver().cuMemPoolDestroy(memPool); });
}
cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  return Call([&] { return Driver().cuMemPoolTrimTo(memPool, minBytesToKeep); });
}
// cudaMemAccessDesc and CUmemAccessDesc, cudaMemLocation and CUmemLocation are laid out alike.
cudaError_t CUDARTAPI cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc* descList, size_t count) {
  return Call([&] { return Driver().cuMemPoolSetAccess(memPool, reinterpret_cast<const CUmemAccessDesc*>(descList), count); });
}
cudaError_t CUDARTAPI cudaMemPoolGetAccess(enum cudaMemAccessFlags* flags, cudaMemPool_t memPool,
                                           struct cudaMemLocation* location) {
  return Call([&] {
    return Driver().cuMemPoolGetAccess(reinterpret_cast<CUmemAccess_flags*>(flags), memPool,
                                       reinterpret_cast<CUmemLocation*>(location));
  });
}
// cudaMemPoolAttr and CUmemPool_attribute number the attributes alike.
cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  return Call([&] { return Driver().cuMemPoolGetAttribute(memPool, static_cast<CUmemPool_attribute>(attr), value); });
}
cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  return Call([&] { return Driver().cuMemPoolSetAttribute(memPool, static_cast<CUmemPool_attribute>(attr), value); });
}

// ---- copies and memsets ----

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  return Memcpy(dst, src, count, kind, false);
}
cudaError_t CUDARTAPI cudaMemcpy_ptds(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  return Memcpy(dst, src, count, kind, true);
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  return MemcpyAsync(dst, src, count, kind, stream, false);
}
cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                           cudaStream_t stream) {
  return MemcpyAsync(dst, src, count, kind, stream, true);
}
cudaError_t CUDARTAPI cudaMemset(void* devPtr, int value, size_t count) {
  return Call([&] { return Driver().cuMemsetD8_v2(Dev(devPtr), static_cast<unsigned char>(value), count); });
}
cudaError_t CUDARTAPI cudaMemset_ptds(void* devPtr, int value, size_t count) {
  return Call([&] { return Driver().cuMemsetD8_v2_ptds(Dev(devPtr), static_cast<unsigned char>(value), count); });
}
cudaError_t CUDARTAPI cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return Call(
      [&] { return Driver().cuMemsetD8Async(Dev(devPtr), static_cast<unsigned char>(value), count, stream); });
}
cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return Call([&] {
    return Driver().cuMemsetD8Async_ptsz(Dev(devPtr), static_cast<unsigned char>(value), count, stream);
  });
}
