// Stream creation and destruction: forwarded untouched, and reported to the pools' driver backend
// (driver_backend.h), whose device fences must cover every stream that may still be using freed
// memory. How libcudart creates its streams too (cudaStreamCreate* reach these through
// cuGetProcAddress).
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "cuda/driver_backend.h"
#include "cuda/real_driver.h"
#include "hooks/driver_hook.h"

using gpushim::real_driver;
using gpushim::driver_hook::call;

GPUSHIM_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
  const CUresult r = call(real_driver().cuStreamCreate, phStream, flags);
  if (r == CUDA_SUCCESS && phStream != nullptr) gpushim::note_stream_created(*phStream, flags);
  return r;
}

GPUSHIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  const CUresult r = call(real_driver().cuStreamCreateWithPriority, phStream, flags, priority);
  if (r == CUDA_SUCCESS && phStream != nullptr) gpushim::note_stream_created(*phStream, flags);
  return r;
}

GPUSHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  gpushim::note_stream_destroying(hStream);
  return call(real_driver().cuStreamDestroy_v2, hStream);
}
