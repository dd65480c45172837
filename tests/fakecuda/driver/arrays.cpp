// CUDA arrays: cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate and their destroys, descriptors
// and memory requirements (what cudaMallocArray, cudaMalloc3DArray and cudaMallocMipmappedArray reach).
//
// An array is an opaque handle over device memory the program never addresses: its storage is a
// kArray region of the current context, charged against the device like any allocation (so
// cuMemGetInfo sees it), and freed by the destroy or with the context. The layout is the fake's
// own: rows padded to kAllocAlignment, layers and mip levels one after another; what the program
// can learn of it is how much device memory it took (cuMemGetInfo). cuArrayGetMemoryRequirements
// answers only for an array made with CUDA_ARRAY3D_DEFERRED_MAPPING, which takes no memory until
// the program maps some (not simulated): any other gets CUDA_ERROR_INVALID_VALUE, as CUDA documents
// ("If the CUDA array is not allocated with flag CUDA_ARRAY3D_DEFERRED_MAPPING
// CUDA_ERROR_INVALID_VALUE will be returned"). Only the plain element formats (8, 16 and
// 32-bit integers, half and float, 1, 2 or 4 channels) are simulated: any other format is refused
// with CUDA_ERROR_INVALID_VALUE, stricter than a GPU, never looser. Handles are minted (handles.h):
// a destroyed or never-created array stops the process, where a real driver would crash. A test
// can have a destroyed array's handle handed out again (fakecudaReuseArrayHandles), as NVIDIA's
// driver, whose handles are host pointers, may.
#include "driver.h"

namespace fakecuda {
namespace {

constexpr unsigned kKnownFlags = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP |
                                 CUDA_ARRAY3D_TEXTURE_GATHER | CUDA_ARRAY3D_DEFERRED_MAPPING;

std::size_t FormatBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
  }
}

// Bytes of one level of `d` (width, height, depth already those of the level), 0 when the product
// overflows.
std::size_t LevelBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, std::size_t w, std::size_t h, std::size_t depth) {
  const std::size_t element = FormatBytes(d.Format) * d.NumChannels;
  std::size_t row = 0, bytes = 0;
  if (__builtin_mul_overflow(w, element, &row)) return 0;
  row = RoundUp(row, kAllocAlignment);
  if (row == 0 || __builtin_mul_overflow(row, std::max<std::size_t>(h, 1), &bytes) ||
      __builtin_mul_overflow(bytes, std::max<std::size_t>(depth, 1), &bytes))
    return 0;
  return bytes;
}

// CUDA_SUCCESS with the bytes `d` needs over `levels` mip levels (1: a plain array), or why not.
CUresult ArrayBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, std::size_t* out) {
  if (d.Width == 0 || FormatBytes(d.Format) == 0 || (d.NumChannels != 1 && d.NumChannels != 2 && d.NumChannels != 4) ||
      (d.Flags & ~kKnownFlags) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (d.Depth != 0 && d.Height == 0 && !(d.Flags & CUDA_ARRAY3D_LAYERED)) return CUDA_ERROR_INVALID_VALUE;
  // A cubemap is six square faces (times its layers when layered).
  if ((d.Flags & CUDA_ARRAY3D_CUBEMAP) &&
      (d.Width != d.Height || ((d.Flags & CUDA_ARRAY3D_LAYERED) ? d.Depth % 6 != 0 : d.Depth != 6)))
    return CUDA_ERROR_INVALID_VALUE;
  const bool layered = (d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  std::size_t total = 0, w = d.Width, h = d.Height, depth = d.Depth;
  for (unsigned l = 0; l < levels; ++l) {
    const std::size_t level = LevelBytes(d, w, h, depth);
    if (level == 0 || __builtin_add_overflow(total, level, &total)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (w == 1 && h <= 1 && (layered || depth <= 1)) {
      if (l + 1 < levels) return CUDA_ERROR_INVALID_VALUE;  // more levels than the extent allows
      break;
    }
    w = std::max<std::size_t>(w / 2, 1);
    if (h != 0) h = std::max<std::size_t>(h / 2, 1);
    if (!layered && depth != 0) depth = std::max<std::size_t>(depth / 2, 1);
  }
  *out = total;
  return CUDA_SUCCESS;
}

CUresult Create(std::uintptr_t* handle, const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, HandleKind kind) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  std::size_t bytes = 0;
  if (CUresult r = ArrayBytes(d, std::max(levels, 1u), &bytes); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uintptr_t base = 0;  // none for a deferred mapping: the memory comes with cuMemMapArrayAsync
  if (!(d.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING))
    if (CUresult r = AllocateArenaRegion(s, ctx, bytes, RegionKind::kArray, nullptr, &base); r != CUDA_SUCCESS)
      return r;
  std::uintptr_t& reusable = kind == HandleKind::kMipmappedArray ? s.reusable_mipmapped_array : s.reusable_array;
  const std::uintptr_t h = reusable != 0 ? reusable : MintHandle(s, kind);
  if (reusable != 0) ReviveHandle(s, kind, h);
  reusable = 0;
  s.arrays[h] = CudaArray{ctx, base, bytes, d, kind == HandleKind::kMipmappedArray ? levels : 0};
  *handle = h;
  return CUDA_SUCCESS;
}

// The live array `h` of `kind`; anything else stops the process (handles.h).
CudaArray& Lookup(State& s, std::uintptr_t h, HandleKind kind, const char* call) {
  // (A null handle is refused before this: CUDA_ERROR_INVALID_HANDLE, as the driver answers it.)
  auto it = s.arrays.find(h);
  if (it == s.arrays.end() || (it->second.levels != 0) != (kind == HandleKind::kMipmappedArray))
    BadHandle(s, call, kind, h);
  return it->second;
}

CUresult Destroy(std::uintptr_t h, HandleKind kind, const char* call) {
  if (h == 0) return CUDA_ERROR_INVALID_HANDLE;
  State& s = GetState();
  std::unique_lock lk(s.mu);
  // A fork child is refused. A thread with no current context is not: the array knows its
  // context, and an H200 destroyed arrays there (2026-11-29, docs/gpu-validation.md run 8), though
  // CUDA lists CUDA_ERROR_INVALID_CONTEXT among cuArrayDestroy's errors.
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  CudaArray& a = Lookup(s, h, kind, call);
  const std::uintptr_t base = a.region;
  const int device = a.ctx->device;
  BuryHandle(s, kind, h, call);
  s.arrays.erase(h);
  if (s.reuse_array_handles) (kind == HandleKind::kMipmappedArray ? s.reusable_mipmapped_array : s.reusable_array) = h;
  ++s.device_free_calls;
  // Like cuMemFree: copies and kernels issued earlier may still use the array.
  ++s.device_syncs;
  SyncDevice(s, lk, device);
  if (base != 0) ReleaseRegion(s, base);
  return CUDA_SUCCESS;
}

CUresult Requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* out, std::uintptr_t h, HandleKind kind, CUdevice device,
                      const char* call) {
  if (h == 0) return CUDA_ERROR_INVALID_HANDLE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  const CudaArray& a = Lookup(s, h, kind, call);
  if (out == nullptr || device != a.ctx->device || !(a.desc.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING))
    return CUDA_ERROR_INVALID_VALUE;
  *out = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
  out->size = RoundUp(a.bytes, kAllocAlignment);
  out->alignment = kAllocAlignment;
  return CUDA_SUCCESS;
}

CUDA_ARRAY3D_DESCRIPTOR From2D(const CUDA_ARRAY_DESCRIPTOR& d) {
  CUDA_ARRAY3D_DESCRIPTOR out{};
  out.Width = d.Width;
  out.Height = d.Height;
  out.Format = d.Format;
  out.NumChannels = d.NumChannels;
  return out;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  if (pHandle == nullptr || pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Create(reinterpret_cast<std::uintptr_t*>(pHandle), From2D(*pAllocateArray), 0, HandleKind::kArray);
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  if (pHandle == nullptr || pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Create(reinterpret_cast<std::uintptr_t*>(pHandle), *pAllocateArray, 0, HandleKind::kArray);
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
                                        unsigned int numMipmapLevels) {
  if (pHandle == nullptr || pMipmappedArrayDesc == nullptr || numMipmapLevels == 0) return CUDA_ERROR_INVALID_VALUE;
  return Create(reinterpret_cast<std::uintptr_t*>(pHandle), *pMipmappedArrayDesc, numMipmapLevels,
                HandleKind::kMipmappedArray);
}

CUresult CUDAAPI cuArrayDestroy(CUarray hArray) {
  return Destroy(reinterpret_cast<std::uintptr_t>(hArray), HandleKind::kArray, "cuArrayDestroy");
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  return Destroy(reinterpret_cast<std::uintptr_t>(hMipmappedArray), HandleKind::kMipmappedArray,
                 "cuMipmappedArrayDestroy");
}

CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
  if (hArray == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  const CudaArray& a = Lookup(s, reinterpret_cast<std::uintptr_t>(hArray), HandleKind::kArray, "cuArray3DGetDescriptor");
  if (pArrayDescriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pArrayDescriptor = a.desc;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
  if (hArray == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  const CudaArray& a = Lookup(s, reinterpret_cast<std::uintptr_t>(hArray), HandleKind::kArray, "cuArrayGetDescriptor");
  if (pArrayDescriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (a.desc.Depth != 0) return CUDA_ERROR_INVALID_VALUE;  // a 3D array has no 2D descriptor
  *pArrayDescriptor = CUDA_ARRAY_DESCRIPTOR{a.desc.Width, a.desc.Height, a.desc.Format, a.desc.NumChannels};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* memoryRequirements, CUarray array,
                                              CUdevice device) {
  return Requirements(memoryRequirements, reinterpret_cast<std::uintptr_t>(array), HandleKind::kArray, device,
                      "cuArrayGetMemoryRequirements");
}

CUresult CUDAAPI cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* memoryRequirements,
                                                       CUmipmappedArray mipmap, CUdevice device) {
  return Requirements(memoryRequirements, reinterpret_cast<std::uintptr_t>(mipmap), HandleKind::kMipmappedArray, device,
                      "cuMipmappedArrayGetMemoryRequirements");
}
