// The policies speak the driver's CUresult; runtime hooks return cudaError_t. One mapping, here.
#pragma once

#include <cuda.h>
#include <driver_types.h>

namespace gpushim {

// An allocation call CUDA refused for its arguments (a NULL pointer, size 0, a bad pitch or
// stream) is not a failed allocation: under every policy, failed_allocs counts only the calls that
// could not get memory (out of memory, over the cap, other driver errors).
inline bool is_argument_error(cudaError_t e) {
  return e == cudaErrorInvalidValue || e == cudaErrorInvalidPitchValue || e == cudaErrorInvalidResourceHandle;
}
inline bool is_argument_error(CUresult r) { return r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE; }

inline cudaError_t to_runtime_error(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
    default: return cudaErrorUnknown;
  }
}

// The other direction, for driver hooks answering with what a pool (speaking runtime codes) said.
inline CUresult to_driver_error(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorInitializationError: return CUDA_ERROR_NOT_INITIALIZED;
    case cudaErrorCudartUnloading: return CUDA_ERROR_DEINITIALIZED;
    case cudaErrorDeviceUninitialized: return CUDA_ERROR_INVALID_CONTEXT;
    case cudaErrorNoDevice: return CUDA_ERROR_NO_DEVICE;
    case cudaErrorInvalidDevice: return CUDA_ERROR_INVALID_DEVICE;
    case cudaErrorNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case cudaErrorStreamCaptureUnsupported: return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    case cudaErrorStreamCaptureInvalidated: return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorContextIsDestroyed: return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    default: return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace gpushim
