// The real driver entry points behind our driver hooks, resolved from libcuda.so.1 with the real
// dlsym (a handle-scoped lookup never finds our own definitions, so forwarding cannot loop).
//
// This table serves the hooks only. The pools reach the driver through DriverBackend, whose own
// table (driver_backend.cpp) is just as private: neither ever passes through a hook of ours.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/hooked_symbols.h"

namespace gpushim {

// X(member, exported symbol, function pointer type): every real driver function a hook forwards to
// (the hooked ones, cuda/hooked_symbols.h) or the core needs for its bookkeeping (the rest).
// clang-format off
#define GPUSHIM_CORE_DRIVER_FUNCTIONS(X)                                                               \
  X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle",                  \
    decltype(&::cuMemGetAllocationPropertiesFromHandle))                                               \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", decltype(&::cuCtxGetCurrent))                                  \
  X(cuCtxGetDevice, "cuCtxGetDevice", decltype(&::cuCtxGetDevice))                                     \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2", decltype(&::cuCtxPushCurrent_v2))                      \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2", decltype(&::cuCtxPopCurrent_v2))                         \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", decltype(&::cuStreamIsCapturing))                      \
  X(cuStreamIsCapturing_ptsz, "cuStreamIsCapturing_ptsz", decltype(&::cuStreamIsCapturing))            \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode",                            \
    decltype(&::cuThreadExchangeStreamCaptureMode))                                                    \
  X(cuInit, "cuInit", decltype(&::cuInit))                                                             \
  X(cuDeviceGet, "cuDeviceGet", decltype(&::cuDeviceGet))                                              \
  X(cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2", decltype(&::cuDeviceTotalMem_v2))                      \
  X(cuDeviceGetCount, "cuDeviceGetCount", decltype(&::cuDeviceGetCount))                               \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", decltype(&::cuDeviceGetDefaultMemPool))    \
  X(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", decltype(&::cuDevicePrimaryCtxGetState)) \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", decltype(&::cuDevicePrimaryCtxRetain))       \
  X(cuDeviceGetMemPool, "cuDeviceGetMemPool", decltype(&::cuDeviceGetMemPool))                         \
  X(cuStreamGetFlags, "cuStreamGetFlags", decltype(&::cuStreamGetFlags))                               \
  X(cuStreamGetCtx, "cuStreamGetCtx", decltype(&::cuStreamGetCtx))                                     \
  X(cuEventCreate, "cuEventCreate", decltype(&::cuEventCreate))                                        \
  X(cuEventRecord, "cuEventRecord", decltype(&::cuEventRecord))                                        \
  X(cuEventQuery, "cuEventQuery", decltype(&::cuEventQuery))                                           \
  X(cuEventDestroy_v2, "cuEventDestroy_v2", decltype(&::cuEventDestroy_v2))                            \
  X(cuEventSynchronize, "cuEventSynchronize", decltype(&::cuEventSynchronize))                         \
  X(cuStreamSynchronize, "cuStreamSynchronize", decltype(&::cuStreamSynchronize))                      \
  X(cuGetErrorName, "cuGetErrorName", decltype(&::cuGetErrorName))

#define GPUSHIM_REAL_DRIVER_FUNCTIONS(X) \
  GPUSHIM_HOOKED_DRIVER_FUNCTIONS(X)     \
  GPUSHIM_CORE_DRIVER_FUNCTIONS(X)
// clang-format on

struct RealDriver {
#define GPUSHIM_REAL_DRIVER_SLOT(member, symbol, type) type member = nullptr;
  GPUSHIM_REAL_DRIVER_FUNCTIONS(GPUSHIM_REAL_DRIVER_SLOT)
#undef GPUSHIM_REAL_DRIVER_SLOT
};

// Resolved on first use, thread-safe. Entries are null when libcuda.so.1 cannot be loaded or lacks
// them. A call made while this thread is still resolving (libcuda's own constructors calling back
// into a hook) gets an empty table rather than a deadlock.
const RealDriver& real_driver();

// The device of the calling thread's current context; false without one (the driver decides
// what a call made then means).
bool current_context_device(int* device);

// The handle of `ordinal`'s primary context if it is active (retained and released again, which
// leaves its reference count as it was); null otherwise. Never creates one.
CUcontext primary_context_if_active(int ordinal);
// The device whose active primary context `ctx` is; -1 if it is none (a context the program made).
int device_of_primary_context(CUcontext ctx);

// Total memory of a device as the driver reports it, without needing a context; 0 if unknown.
uint64_t device_total_memory(int ordinal);

}  // namespace gpushim
