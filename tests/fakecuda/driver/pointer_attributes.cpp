// Pointer queries: cuPointerGetAttribute(s) and cuMemGetAddressRange.
//
// As in CUDA they describe the allocation that *contains* the pointer, not the pointer itself: a
// pool that sub-allocates from one cuMemAlloc segment sees the segment's base and size. For VMM
// memory, RANGE_START_ADDR/RANGE_SIZE describe the address reservation while cuMemGetAddressRange
// and MAPPING_BASE_ADDR/MAPPING_SIZE describe the mapping (cuda.h documents exactly that split).
// Boolean attributes are written as 32-bit unsigned ints, the type callers use.
#include <cstring>

#include "driver.h"

namespace fakecuda {
namespace {

template <typename T>
void Put(void* data, T value) {
  std::memcpy(data, &value, sizeof(T));
}

bool HostAccessibleKind(const Region& r) {
  return r.kind == RegionKind::kPinnedHost || r.kind == RegionKind::kManaged ||
         (r.kind == RegionKind::kVmmMapping && r.device < 0);
}

CUresult Describe(State& s, const Region& r, CUpointer_attribute attribute, CUdeviceptr ptr, void* data) {
  const bool vmm = r.kind == RegionKind::kVmmMapping;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      Put(data, reinterpret_cast<CUcontext>(r.ctx));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {
      // Managed memory reports DEVICE plus IS_MANAGED, like the driver.
      const bool host = r.kind == RegionKind::kPinnedHost || (vmm && r.device < 0);
      Put(data, static_cast<unsigned int>(host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE));
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      Put(data, ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      // Device memory has no host address in CUDA (even though the fake's is dereferenceable).
      if (!HostAccessibleKind(r)) return CUDA_ERROR_INVALID_VALUE;
      Put(data, reinterpret_cast<void*>(ptr));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      Put(data, 1u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      Put(data, static_cast<unsigned long long>(r.buffer_id));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      Put(data, static_cast<unsigned int>(r.kind == RegionKind::kManaged));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      Put(data, r.device >= 0 ? r.device : (r.ctx != nullptr ? r.ctx->device : 0));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      Put(data, static_cast<unsigned int>(r.kind == RegionKind::kDeviceMalloc));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      Put(data, static_cast<CUdeviceptr>(vmm ? r.reservation_base : r.base));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      Put(data, static_cast<size_t>(vmm ? r.reservation_size : r.size));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      Put(data, 1u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      Put(data, static_cast<unsigned long long>(vmm ? r.phys->prop.requestedHandleTypes : CU_MEM_HANDLE_TYPE_NONE));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      Put(data, 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
      CUDA_POINTER_ATTRIBUTE_ACCESS_FLAGS f = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      if (vmm) {
        f = r.access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
            : r.access == CU_MEM_ACCESS_FLAGS_PROT_READ    ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                           : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
      }
      Put(data, f);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      // Graph memory belongs to no pool the program can name: an H200 answers
      // CUDA_ERROR_INVALID_VALUE for a captured allocation (2026-11-27).
      if (r.kind == RegionKind::kGraph) return CUDA_ERROR_INVALID_VALUE;
      // The program's handle: a default pool's is its address, a created pool's is minted.
      Put(data, r.pool == nullptr   ? CUmemoryPool{}
                : r.pool->is_default ? reinterpret_cast<CUmemoryPool>(r.pool)
                                     : reinterpret_cast<CUmemoryPool>(r.pool->handle));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      Put(data, static_cast<size_t>(r.size));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      Put(data, reinterpret_cast<void*>(r.base));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      Put(data, static_cast<unsigned long long>(vmm ? r.phys->id : r.buffer_id));
      return CUDA_SUCCESS;
    default:
      (void)s;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// What cuPointerGetAttributes reports for memory CUDA knows nothing about.
CUresult DescribeUnknown(CUpointer_attribute attribute, void* data) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: Put(data, CUcontext{nullptr}); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: Put(data, 0u); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: Put(data, CUdeviceptr{0}); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: Put(data, static_cast<void*>(nullptr)); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: Put(data, -2); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: Put(data, 0ULL); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: Put(data, CUdeviceptr{0}); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: Put(data, size_t{0}); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: Put(data, static_cast<void*>(nullptr)); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: Put(data, CUmemoryPool{nullptr}); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: Put(data, 0u); return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// CUDA: after cuMemFreeAsync returns, "querying its pointer attributes results in undefined
// behavior": while the free waits for its stream, and after it ran, until an allocation takes the
// address again. An allocation a cuMemFree is freeing right now answers as freed already, which it
// is a moment later: CUDA refuses the query of a freed pointer (the shim's context walk relies on it).
const Region* Queryable(const State& s, const Region* region, std::uintptr_t ptr, const char* call) {
  if (region == nullptr) {
    if (const std::uintptr_t base = AsyncFreedAt(s, ptr))
      Misuse("%s: %#lx is in the allocation at %#lx, which was freed with cuMemFreeAsync (and its stream has "
             "reached the free): CUDA leaves querying it undefined",
             call, static_cast<unsigned long>(ptr), static_cast<unsigned long>(base));
    return nullptr;
  }
  if (!region->free_pending) return region;
  if (region->stream_ordered_free)
    Misuse("%s: %#lx is in the allocation at %#lx, which was freed with cuMemFreeAsync: CUDA leaves querying it "
           "undefined",
           call, static_cast<unsigned long>(ptr), static_cast<unsigned long>(region->base));
  return nullptr;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Region* region = Queryable(s, FindRegion(s, ptr), ptr, "cuPointerGetAttribute");
  if (region == nullptr) return CUDA_ERROR_INVALID_VALUE;  // not a CUDA pointer
  return Describe(s, *region, attribute, ptr, data);
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                        CUdeviceptr ptr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (numAttributes == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Unlike the singular form, unknown pointers are not an error: attributes get default values.
  const Region* region = Queryable(s, FindRegion(s, ptr), ptr, "cuPointerGetAttributes");
  for (unsigned int i = 0; i < numAttributes; ++i) {
    if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = region != nullptr ? Describe(s, *region, attributes[i], ptr, data[i])
                                   : DescribeUnknown(attributes[i], data[i]);
    // An attribute that does not apply (HOST_POINTER of device memory) reads as null here.
    if (r != CUDA_SUCCESS && attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
      Put(data[i], static_cast<void*>(nullptr));
      r = CUDA_SUCCESS;
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  const Region* region = Queryable(s, FindRegion(s, dptr), dptr, "cuMemGetAddressRange");
  if (region == nullptr || region->kind == RegionKind::kPinnedHost) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = region->base;
  if (psize != nullptr) *psize = region->size;
  return CUDA_SUCCESS;
}
