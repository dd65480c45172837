// CUDA arrays: cudaMallocArray, cudaMalloc3DArray, cudaMallocMipmappedArray and their frees, through
// the driver's cuArray3DCreate and cuMipmappedArrayCreate as NVIDIA's runtime does (so an
// interposer sees them at the driver). cudaArray_t and CUarray are one type to CUDA ("may be used
// interchangeably by casting"), as are cudaMipmappedArray_t and CUmipmappedArray.
#include "runtime.h"

using namespace fakecudart;

namespace {

// The driver's format for a channel descriptor: every used channel of one size (x, then y, z, w),
// 1, 2 or 4 of them. False for anything else, which CUDA refuses (cudaErrorInvalidChannelDescriptor).
bool DriverFormat(const cudaChannelFormatDesc& c, CUarray_format* format, unsigned* channels) {
  const int bits[4] = {c.x, c.y, c.z, c.w};
  unsigned n = 0;
  while (n < 4 && bits[n] != 0) ++n;
  for (unsigned i = n; i < 4; ++i)
    if (bits[i] != 0) return false;
  if (n == 0 || n == 3) return false;
  for (unsigned i = 1; i < n; ++i)
    if (bits[i] != c.x) return false;
  switch (c.f) {
    case cudaChannelFormatKindSigned:
    case cudaChannelFormatKindUnsigned: {
      const bool s = c.f == cudaChannelFormatKindSigned;
      if (c.x == 8) *format = s ? CU_AD_FORMAT_SIGNED_INT8 : CU_AD_FORMAT_UNSIGNED_INT8;
      else if (c.x == 16) *format = s ? CU_AD_FORMAT_SIGNED_INT16 : CU_AD_FORMAT_UNSIGNED_INT16;
      else if (c.x == 32) *format = s ? CU_AD_FORMAT_SIGNED_INT32 : CU_AD_FORMAT_UNSIGNED_INT32;
      else return false;
      break;
    }
    case cudaChannelFormatKindFloat:
      if (c.x == 16) *format = CU_AD_FORMAT_HALF;
      else if (c.x == 32) *format = CU_AD_FORMAT_FLOAT;
      else return false;
      break;
    default:
      return false;
  }
  *channels = n;
  return true;
}

// cudaArrayLayered, cudaArraySurfaceLoadStore, cudaArrayCubemap and cudaArrayTextureGather have the
// values of CUDA_ARRAY3D_LAYERED, _SURFACE_LDST, _CUBEMAP and _TEXTURE_GATHER.
cudaError_t Describe(const cudaChannelFormatDesc* desc, cudaExtent extent, unsigned flags,
                     CUDA_ARRAY3D_DESCRIPTOR* out) {
  if (desc == nullptr) return cudaErrorInvalidValue;
  *out = CUDA_ARRAY3D_DESCRIPTOR{};
  if (!DriverFormat(*desc, &out->Format, &out->NumChannels)) return cudaErrorInvalidChannelDescriptor;
  out->Width = extent.width;
  out->Height = extent.height;
  out->Depth = extent.depth;
  out->Flags = flags;
  return cudaSuccess;
}

}  // namespace

cudaError_t CUDARTAPI cudaMallocArray(cudaArray_t* array, const cudaChannelFormatDesc* desc, size_t width,
                                      size_t height, unsigned int flags) {
  cudaExtent extent{};
  extent.width = width;
  extent.height = height;
  return cudaMalloc3DArray(array, desc, extent, flags);
}

cudaError_t CUDARTAPI cudaMalloc3DArray(cudaArray_t* array, const cudaChannelFormatDesc* desc, cudaExtent extent,
                                        unsigned int flags) {
  if (array == nullptr) return Record(cudaErrorInvalidValue);
  CUDA_ARRAY3D_DESCRIPTOR d;
  if (cudaError_t e = Describe(desc, extent, flags, &d); e != cudaSuccess) return Record(e);
  CUarray a = nullptr;
  const cudaError_t e = Call([&] { return Driver().cuArray3DCreate_v2(&a, &d); });
  if (e == cudaSuccess) *array = reinterpret_cast<cudaArray_t>(a);
  return e;
}

cudaError_t CUDARTAPI cudaFreeArray(cudaArray_t array) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  if (array == nullptr) return cudaSuccess;  // like cudaFree(nullptr)
  return Call([&] { return Driver().cuArrayDestroy(reinterpret_cast<CUarray>(array)); });
}

cudaError_t CUDARTAPI cudaMallocMipmappedArray(cudaMipmappedArray_t* mipmappedArray, const cudaChannelFormatDesc* desc,
                                               cudaExtent extent, unsigned int numLevels, unsigned int flags) {
  if (mipmappedArray == nullptr) return Record(cudaErrorInvalidValue);
  CUDA_ARRAY3D_DESCRIPTOR d;
  if (cudaError_t e = Describe(desc, extent, flags, &d); e != cudaSuccess) return Record(e);
  CUmipmappedArray m = nullptr;
  const cudaError_t e = Call([&] { return Driver().cuMipmappedArrayCreate(&m, &d, numLevels); });
  if (e == cudaSuccess) *mipmappedArray = reinterpret_cast<cudaMipmappedArray_t>(m);
  return e;
}

cudaError_t CUDARTAPI cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  if (mipmappedArray == nullptr) return cudaSuccess;
  return Call([&] { return Driver().cuMipmappedArrayDestroy(reinterpret_cast<CUmipmappedArray>(mipmappedArray)); });
}
