// The real driver entry points behind our driver hooks, resolved from libcuda.so.1 with the real
// dlsym (a handle-scoped lookup never finds our own definitions, so forwarding cannot loop).
//
// This table serves the hooks only. The pools reach the driver through DriverBackend, whose own
// table (driver_backend.cpp) is just as private: neither ever passes through a hook of ours.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gpushim {

// The types of the variants cuda.h declares only in some modes (_ptsz with per-thread default
// stream builds, the 4-argument cuGetProcAddress with __CUDA_API_VERSION_INTERNAL).
using CuGetProcAddressV1 = CUresult (*)(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);

// X(member, exported symbol, function pointer type): every real driver function a hook forwards to
// or the core needs for its bookkeeping. Members are named after the symbol, except where cuda.h
// turns the plain name into a macro.
// clang-format off
#define GPUSHIM_REAL_DRIVER_FUNCTIONS(X)                                                                        \
  X(cuMemAlloc_v2, "cuMemAlloc_v2", decltype(&::cuMemAlloc_v2))                                                 \
  X(cuMemFree_v2, "cuMemFree_v2", decltype(&::cuMemFree_v2))                                                    \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch_v2", decltype(&::cuMemAllocPitch_v2))                                  \
  X(cuMemAllocManaged, "cuMemAllocManaged", decltype(&::cuMemAllocManaged))                                     \
  X(cuMemHostAlloc, "cuMemHostAlloc", decltype(&::cuMemHostAlloc))                                              \
  X(cuMemAllocHost_v2, "cuMemAllocHost_v2", decltype(&::cuMemAllocHost_v2))                                     \
  X(cuMemFreeHost, "cuMemFreeHost", decltype(&::cuMemFreeHost))                                                 \
  X(cuMemAllocAsync, "cuMemAllocAsync", decltype(&::cuMemAllocAsync))                                           \
  X(cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz", decltype(&::cuMemAllocAsync))                                 \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", decltype(&::cuMemAllocFromPoolAsync))                   \
  X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz", decltype(&::cuMemAllocFromPoolAsync))         \
  X(cuMemFreeAsync, "cuMemFreeAsync", decltype(&::cuMemFreeAsync))                                              \
  X(cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz", decltype(&::cuMemFreeAsync))                                    \
  X(cuMemCreate, "cuMemCreate", decltype(&::cuMemCreate))                                                       \
  X(cuMemRelease, "cuMemRelease", decltype(&::cuMemRelease))                                                    \
  X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", decltype(&::cuMemRetainAllocationHandle))       \
  X(cuMemMap, "cuMemMap", decltype(&::cuMemMap))                                                                \
  X(cuMemUnmap, "cuMemUnmap", decltype(&::cuMemUnmap))                                                          \
  X(cuMemAddressReserve, "cuMemAddressReserve", decltype(&::cuMemAddressReserve))                               \
  X(cuMemAddressFree, "cuMemAddressFree", decltype(&::cuMemAddressFree))                                        \
  X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", decltype(&::cuMemImportFromShareableHandle)) \
  X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle",                           \
    decltype(&::cuMemGetAllocationPropertiesFromHandle))                                                        \
  X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", decltype(&::cuGraphAddMemAllocNode))                      \
  X(cuMemGetInfo_v2, "cuMemGetInfo_v2", decltype(&::cuMemGetInfo_v2))                                           \
  X(cuMemGetAddressRange_v2, "cuMemGetAddressRange_v2", decltype(&::cuMemGetAddressRange_v2))                   \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", decltype(&::cuPointerGetAttribute))                         \
  X(cuPointerGetAttributes, "cuPointerGetAttributes", decltype(&::cuPointerGetAttributes))                      \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", decltype(&::cuIpcGetMemHandle))                                    \
  X(get_proc_address_v1, "cuGetProcAddress", CuGetProcAddressV1)                                                \
  X(get_proc_address_v2, "cuGetProcAddress_v2", decltype(&::cuGetProcAddress_v2))                              \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", decltype(&::cuCtxGetCurrent))                                           \
  X(cuCtxGetDevice, "cuCtxGetDevice", decltype(&::cuCtxGetDevice))                                              \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", decltype(&::cuStreamIsCapturing))                               \
  X(cuStreamIsCapturing_ptsz, "cuStreamIsCapturing_ptsz", decltype(&::cuStreamIsCapturing))                     \
  X(cuInit, "cuInit", decltype(&::cuInit))                                                                      \
  X(cuDeviceGet, "cuDeviceGet", decltype(&::cuDeviceGet))                                                       \
  X(cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2", decltype(&::cuDeviceTotalMem_v2))                              \
  X(cuDeviceGetCount, "cuDeviceGetCount", decltype(&::cuDeviceGetCount))                                        \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", decltype(&::cuDeviceGetDefaultMemPool))             \
  X(cuDeviceSetMemPool, "cuDeviceSetMemPool", decltype(&::cuDeviceSetMemPool))                                  \
  X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", decltype(&::cuMemPoolGetAttribute))                         \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", decltype(&::cuMemPoolSetAttribute))                         \
  X(cuMemPoolTrimTo, "cuMemPoolTrimTo", decltype(&::cuMemPoolTrimTo))                                           \
  X(cuStreamCreate, "cuStreamCreate", decltype(&::cuStreamCreate))                                              \
  X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", decltype(&::cuStreamCreateWithPriority))          \
  X(cuStreamDestroy_v2, "cuStreamDestroy_v2", decltype(&::cuStreamDestroy_v2))                                   \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset_v2", decltype(&::cuDevicePrimaryCtxReset_v2))          \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2", decltype(&::cuDevicePrimaryCtxRelease_v2))    \
  X(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", decltype(&::cuDevicePrimaryCtxGetState))        \
  X(cuCtxDestroy_v2, "cuCtxDestroy_v2", decltype(&::cuCtxDestroy_v2))                                           \
  X(cuCtxDestroy_v1, "cuCtxDestroy", decltype(&::cuCtxDestroy_v2))
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

// Total memory of a device as the driver reports it, without needing a context; 0 if unknown.
uint64_t device_total_memory(int ordinal);

}  // namespace gpushim
