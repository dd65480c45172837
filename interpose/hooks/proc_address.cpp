// cuGetProcAddress and cuGetProcAddress_v2: how libcudart, and every library carrying a static
// copy of it, obtains each driver function (by base name, ABI version and stream flags), and
// what cudaGetDriverEntryPoint[ByVersion] goes through.
//
// The real function answers first, so the caller's cudaVersion and flags choose the variant
// exactly as without us; we then substitute our hook for exactly that variant (a per-thread-stream
// caller gets our _ptsz hook, a caller asking for the 4-argument cuGetProcAddress gets our
// 4-argument one). Everything we do not hook, cuGetExportTable included, passes through untouched.
// No shim state is touched: the runtime calls these while it initializes.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "cuda/real_driver.h"
#include "hooks/substitution.h"

#include "hooks/export.h"

GPUSHIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  const auto real = gpushim::real_driver().get_proc_address_v1;
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = gpushim::substitute_driver_function(*pfn);
  return r;
}

GPUSHIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* symbolStatus) {
  const auto real = gpushim::real_driver().get_proc_address_v2;
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = gpushim::substitute_driver_function(*pfn);
  return r;
}
