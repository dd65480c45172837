// The driver's virtual-memory API (cuMemCreate and friends): how NCCL and PyTorch's expandable
// segments get device memory. Physical memory is counted once, from cuMemCreate (or the first
// mapping of an imported allocation) until CUDA really frees it, i.e. until it is both released
// and unmapped, in whichever order the program does those (accounting/vmm_tracker.h).
#define __CUDA_API_VERSION_INTERNAL 1
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

GPUSHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                    unsigned long long flags) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMemCreate, handle, size, prop, flags); };
  Shim* s = accounting(scope);
  if (!s || handle == nullptr || prop == nullptr) return forward();
  MemoryKind kind;
  int device = -1;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      kind = MemoryKind::kDevice;
      device = prop->location.id;
      break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      // Host memory (NCCL makes some with no current context): never asks for a context or device.
      kind = MemoryKind::kHost;
      break;
    default:
      return forward();  // invalid: CUDA says so
  }
  // Recorded under the handle's key; GPUSHIM_FAIL leaves the virtual-memory API alone.
  const gpushim::ForwardedAlloc a{.kind = kind, .device = device, .size = size, .requested = size,
                                  .injectable = false};
  const CUresult r =
      s->forward_alloc(a, forward, [&] { return gpushim::VmmTracker::key_of(static_cast<uint64_t>(*handle)); });
  if (r == CUDA_SUCCESS) s->vmm_created(static_cast<uint64_t>(*handle), size, kind, device);
  return r;
}

GPUSHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  GPUSHIM_SCOPE;
  const CUresult r = call(real_driver().cuMemRelease, handle);
  Shim* s = accounting(scope);
  if (r == CUDA_SUCCESS && s) s->vmm_released(static_cast<uint64_t>(handle));
  return r;
}

GPUSHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  GPUSHIM_SCOPE;
  Shim* s = accounting(scope);
  if (s && !s->retain_allowed(reinterpret_cast<uintptr_t>(addr))) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = call(real_driver().cuMemRetainAllocationHandle, handle, addr);
  // Each retain is paired with a cuMemRelease: the memory lives until the last one.
  if (r == CUDA_SUCCESS && s && handle) s->vmm_retained(static_cast<uint64_t>(*handle));
  return r;
}

GPUSHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                 unsigned long long flags) {
  GPUSHIM_SCOPE;
  const CUresult r = call(real_driver().cuMemMap, ptr, size, offset, handle, flags);
  Shim* s = accounting(scope);
  if (r == CUDA_SUCCESS && s) s->vmm_mapped(static_cast<uintptr_t>(ptr), size, static_cast<uint64_t>(handle));
  return r;
}

GPUSHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  GPUSHIM_SCOPE;
  const CUresult r = call(real_driver().cuMemUnmap, ptr, size);
  Shim* s = accounting(scope);
  if (r == CUDA_SUCCESS && s) s->vmm_unmapped(static_cast<uintptr_t>(ptr), size);
  return r;
}

GPUSHIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                            unsigned long long flags) {
  GPUSHIM_SCOPE;
  const CUresult r = call(real_driver().cuMemAddressReserve, ptr, size, alignment, addr, flags);
  Shim* s = accounting(scope);
  if (r == CUDA_SUCCESS && s && ptr) s->va_reserved(static_cast<uintptr_t>(*ptr), size);
  return r;
}

GPUSHIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  GPUSHIM_SCOPE;
  const CUresult r = call(real_driver().cuMemAddressFree, ptr, size);
  Shim* s = accounting(scope);
  if (r == CUDA_SUCCESS && s) s->va_freed(static_cast<uintptr_t>(ptr));
  return r;
}

GPUSHIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                       CUmemAllocationHandleType shHandleType) {
  GPUSHIM_SCOPE;
  const CUresult r = call(real_driver().cuMemImportFromShareableHandle, handle, osHandle, shHandleType);
  Shim* s = accounting(scope);
  if (r != CUDA_SUCCESS || !s || handle == nullptr) return r;
  // Another process's memory: shown apart, charged to nobody here (its exporter pays for it).
  CUmemAllocationProp prop = {};
  int device = -1;
  if (call(real_driver().cuMemGetAllocationPropertiesFromHandle, &prop, *handle) == CUDA_SUCCESS &&
      prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
    device = prop.location.id;
  s->vmm_imported(static_cast<uint64_t>(*handle), device);
  return r;
}
