// CUDA arrays: cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate and their destroys.
// NVIDIA's runtime serves cudaMallocArray, cudaMalloc3DArray and cudaMallocMipmappedArray with these
// (reached through cuGetProcAddress), so hooking the driver sees every path. An array is device
// memory behind an opaque handle: CUDA serves it under every policy, and it is accounted as device
// memory (capped, attributed, reported live until destroyed) under its handle's key
// (accounting/array_books.h). Its size is what its elements take: CUDA tells no array's size
// (cuArrayGetMemoryRequirements answers only for a deferred-mapping array), so the driver's
// padding stays unaccounted. That is known before the call, where the cap is asked. A sparse or
// deferred-mapping array takes no memory when made (cuMemMapArrayAsync maps cuMemCreate memory,
// accounted there): forwarded unaccounted.
#define __CUDA_API_VERSION_INTERNAL 1  // every variant (_v2) under its real name
#include <cuda.h>

#include <algorithm>

#include "accounting/array_books.h"
#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/real_driver.h"
#include "hooks/driver_hook.h"

using gpushim::ArrayBooks;
using gpushim::ForwardedAlloc;
using gpushim::real_driver;
using gpushim::RuntimeCodes;
using gpushim::Shim;
using gpushim::driver_hook::accounting;
using gpushim::driver_hook::call;

namespace {

uint64_t element_bytes(CUarray_format f, unsigned channels) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4ull * channels;
    default: return 1ull * channels;  // 8-bit formats; packed and block-compressed ones are smaller
  }
}

// What the caller asked for: the elements of every level, unpadded (the driver's layout adds to it).
// Saturates at UINT64_MAX.
uint64_t asked_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels) {
  const bool layered = (d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t w = d.Width, h = d.Height, depth = d.Depth, total = 0;
  for (unsigned l = 0; l < std::max(levels, 1u); ++l) {
    uint64_t level = element_bytes(d.Format, d.NumChannels);
    if (__builtin_mul_overflow(level, w, &level) || __builtin_mul_overflow(level, std::max<uint64_t>(h, 1), &level) ||
        __builtin_mul_overflow(level, std::max<uint64_t>(depth, 1), &level) ||
        __builtin_add_overflow(total, level, &total))
      return UINT64_MAX;
    w = std::max<uint64_t>(w / 2, 1);
    if (h != 0) h = std::max<uint64_t>(h / 2, 1);
    if (!layered && depth != 0) depth = std::max<uint64_t>(depth / 2, 1);
  }
  return total;
}

CUDA_ARRAY3D_DESCRIPTOR as_3d(const CUDA_ARRAY_DESCRIPTOR& d) {
  CUDA_ARRAY3D_DESCRIPTOR out{};
  out.Width = d.Width;
  out.Height = d.Height;
  out.Format = d.Format;
  out.NumChannels = d.NumChannels;
  return out;
}

template <typename Handle, typename Forward>
CUresult create(Shim* s, Handle* out, const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, Forward&& forward) {
  if (d.Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) return forward();
  const uint64_t asked = asked_bytes(d, levels);
  // From libcudart: cudaMallocArray and its kin, whose caller gets the runtime's error.
  const ForwardedAlloc a{.size = asked,
                         .requested = asked,
                         .out_of_memory_name = s->called_by_cuda() ? RuntimeCodes::kOutOfMemoryName : nullptr};
  const CUresult r = s->forward_alloc(a, forward, [&] { return ArrayBooks::key_of(*out); });
  if (r == CUDA_SUCCESS) s->array_created(ArrayBooks::key_of(*out));
  return r;
}

template <typename Handle>
CUresult destroy(Shim* s, Handle h, CUresult (*real)(Handle)) {
  auto forward = [&] { return call(real, h); };
  if (s == nullptr || h == nullptr) return forward();
  const uintptr_t key = ArrayBooks::key_of(h);
  const CUcontext ctx = s->array_destroying(key);
  const CUresult r = s->deallocate(reinterpret_cast<void*>(key), nullptr, false, forward, gpushim::FreeApi::kArray);
  if (r != CUDA_SUCCESS) s->array_not_destroyed(key, ctx);
  return r;
}

}  // namespace

GPUSHIM_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuArrayCreate_v2, pHandle, pAllocateArray); };
  Shim* s = accounting(scope);
  if (!s || pHandle == nullptr || pAllocateArray == nullptr) return forward();
  return create(s, pHandle, as_3d(*pAllocateArray), 1, forward);
}

GPUSHIM_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuArray3DCreate_v2, pHandle, pAllocateArray); };
  Shim* s = accounting(scope);
  if (!s || pHandle == nullptr || pAllocateArray == nullptr) return forward();
  return create(s, pHandle, *pAllocateArray, 1, forward);
}

GPUSHIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
                                               unsigned int numMipmapLevels) {
  GPUSHIM_SCOPE;
  auto forward = [&] { return call(real_driver().cuMipmappedArrayCreate, pHandle, pMipmappedArrayDesc, numMipmapLevels); };
  Shim* s = accounting(scope);
  if (!s || pHandle == nullptr || pMipmappedArrayDesc == nullptr) return forward();
  return create(s, pHandle, *pMipmappedArrayDesc, numMipmapLevels, forward);
}

GPUSHIM_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
  GPUSHIM_SCOPE;
  return destroy(accounting(scope), hArray, real_driver().cuArrayDestroy);
}

GPUSHIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  GPUSHIM_SCOPE;
  return destroy(accounting(scope), hMipmappedArray, real_driver().cuMipmappedArrayDestroy);
}
