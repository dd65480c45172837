// Pointer queries and legacy IPC on memory a pool of ours sub-allocates. CUDA only knows our
// segments, so left alone it would describe the segment (cuMemGetAddressRange would hand back
// someone else's bytes as part of the caller's allocation) and export the segment over IPC (the
// importer would map its start: the wrong bytes). These hooks answer for the block the caller was
// given, and refuse an export CUDA cannot make exact (core: Shim::ipc_export_allowed).
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "hooks/driver_hook.h"


using gpushim::real_driver;
using gpushim::Shim;
using gpushim::driver_hook::call;
using Pooled = gpushim::Shim::PooledAddress;

namespace {

template <typename T>
void put(void* data, T value) {
  std::memcpy(data, &value, sizeof(T));
}

// Rewrites what CUDA said about the segment into what is true of the caller's block. Attributes
// of the memory itself (type, device, context, ...) are the segment's and stay as CUDA gave them.
void describe_block(CUpointer_attribute attribute, void* data, const Shim::BlockView& v) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: put(data, static_cast<CUdeviceptr>(v.base)); break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: put(data, static_cast<size_t>(v.size)); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: put(data, reinterpret_cast<void*>(v.base)); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: put(data, static_cast<size_t>(v.size)); break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: put(data, static_cast<unsigned long long>(v.buffer_id)); break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: {
      unsigned int capable = 0;
      std::memcpy(&capable, data, sizeof(capable));
      put(data, static_cast<unsigned int>(capable != 0 && v.ipc_exportable));
      break;
    }
    default: break;
  }
}

// The bytes cuPointerGetAttribute writes for `attribute`; 0 for attributes newer than this code.
size_t attribute_bytes(CUpointer_attribute attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: return sizeof(void*);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: return sizeof(CUmemoryPool);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return sizeof(int);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: return sizeof(unsigned int);
    default: return 0;
  }
}

// What cuPointerGetAttributes reports for memory that is not a CUDA allocation: the program no
// longer (or never) owned this address, whatever the segment around it is to CUDA. Every figure is
// zero (no context, pointer, pool, size or flag) but the device ordinal, -2 as for host memory;
// P2P tokens, and attributes newer than this code, are left as CUDA wrote them.
void describe_unallocated(CUpointer_attribute attribute, void* data) {
  if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) put(data, -2);
  else if (attribute != CU_POINTER_ATTRIBUTE_P2P_TOKENS) std::memset(data, 0, attribute_bytes(attribute));
}

Shim* querying(const gpushim::CallScope& scope) { return scope.nested_in_runtime_hook() ? nullptr : Shim::get(); }

}  // namespace

GPUSHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  gpushim::CallScope scope(gpushim::HookApi::kDriver, __builtin_return_address(0));
  const CUresult r = call(real_driver().cuMemGetAddressRange_v2, pbase, psize, dptr);
  Shim* s = querying(scope);
  if (r != CUDA_SUCCESS || !s) return r;
  Shim::BlockView v;
  switch (s->pooled_address(static_cast<uintptr_t>(dptr), &v)) {
    case Pooled::kNotPooled: return r;
    case Pooled::kNotAllocated: return CUDA_ERROR_NOT_FOUND;  // as for any address no allocation holds
    case Pooled::kLiveBlock: break;
  }
  if (pbase) *pbase = static_cast<CUdeviceptr>(v.base);
  if (psize) *psize = static_cast<size_t>(v.size);
  return r;
}

GPUSHIM_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  gpushim::CallScope scope(gpushim::HookApi::kDriver, __builtin_return_address(0));
  Shim* s = querying(scope);
  // CUDA answers into a buffer of ours first: of a freed pooled block it describes the segment,
  // and the caller's output must stay as CUDA leaves it for an address no allocation holds.
  const size_t bytes = attribute_bytes(attribute);
  alignas(16) unsigned char answer[32] = {};
  static_assert(sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS) <= sizeof(answer), "the largest attribute fits");
  void* into = s != nullptr && data != nullptr && bytes != 0 ? answer : data;
  const CUresult r = call(real_driver().cuPointerGetAttribute, into, attribute, ptr);
  if (r != CUDA_SUCCESS || into == data) return r;
  Shim::BlockView v;
  switch (s->pooled_address(static_cast<uintptr_t>(ptr), &v)) {
    case Pooled::kNotPooled: break;
    case Pooled::kNotAllocated: return CUDA_ERROR_INVALID_VALUE;  // what CUDA says of a freed pointer
    case Pooled::kLiveBlock: describe_block(attribute, answer, v); break;
  }
  std::memcpy(data, answer, bytes);
  return r;
}

GPUSHIM_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                               void** data, CUdeviceptr ptr) {
  gpushim::CallScope scope(gpushim::HookApi::kDriver, __builtin_return_address(0));
  const CUresult r = call(real_driver().cuPointerGetAttributes, numAttributes, attributes, data, ptr);
  Shim* s = querying(scope);
  if (r != CUDA_SUCCESS || !s || attributes == nullptr || data == nullptr) return r;
  Shim::BlockView v;
  const Pooled what = s->pooled_address(static_cast<uintptr_t>(ptr), &v);
  if (what == Pooled::kNotPooled) return r;
  for (unsigned int i = 0; i < numAttributes; ++i) {
    if (data[i] == nullptr) continue;
    if (what == Pooled::kLiveBlock) describe_block(attributes[i], data[i], v);
    else describe_unallocated(attributes[i], data[i]);
  }
  return r;
}

GPUSHIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  gpushim::CallScope scope(gpushim::HookApi::kDriver, __builtin_return_address(0));
  Shim* s = querying(scope);  // nested: our cudaIpcGetMemHandle already decided
  if (s && !s->ipc_export_allowed(static_cast<uintptr_t>(dptr), "cuIpcGetMemHandle")) return CUDA_ERROR_INVALID_VALUE;
  return call(real_driver().cuIpcGetMemHandle, pHandle, dptr);
}

GPUSHIM_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  gpushim::CallScope scope(gpushim::HookApi::kRuntime, __builtin_return_address(0));
  Shim* s = Shim::get();
  if (s && !s->ipc_export_allowed(reinterpret_cast<uintptr_t>(devPtr), "cudaIpcGetMemHandle"))
    return cudaErrorInvalidValue;
  const auto real = gpushim::real_runtime().cudaIpcGetMemHandle;
  return real ? real(handle, devPtr) : cudaErrorInitializationError;
}
