// Device management: selection, synchronization, reset, properties, versions.
#include <cstring>

#include "runtime.h"

using namespace fakecudart;

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Record(cudaErrorInvalidValue);
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) {
    *count = 0;
    return Record(e);
  }
  return Record(Translate(Driver().cuDeviceGetCount(count)));
}

cudaError_t CUDARTAPI cudaSetDevice(int device) { return Record(SelectDevice(device)); }

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  if (device == nullptr) return Record(cudaErrorInvalidValue);
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  *device = CurrentDevice();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  return Call([] { return Driver().cuCtxSynchronize(); });
}

cudaError_t CUDARTAPI cudaDeviceReset(void) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  const int device = CurrentDevice();
  const CUresult r = Driver().cuDevicePrimaryCtxReset_v2(device);
  // A reset keeps the runtime's retain: given back here, as every thread retains again on its
  // next call (the rebinding the generation counter asks for).
  if (r == CUDA_SUCCESS) {
    ForgetPrimaryContext(device);
    Driver().cuDevicePrimaryCtxRelease_v2(device);
  }
  return Record(Translate(r));
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  // cudaDeviceAttr values are the CUdevice_attribute values.
  return Record(Translate(Driver().cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device)));
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return Record(cudaErrorInvalidValue);
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  const DriverApi& d = Driver();
  std::memset(prop, 0, sizeof(*prop));
  if (CUresult r = d.cuDeviceGetName(prop->name, sizeof(prop->name), device); r != CUDA_SUCCESS) {
    return Record(Translate(r));
  }
  CUuuid uuid{};
  d.cuDeviceGetUuid_v2(&uuid, device);
  std::memcpy(&prop->uuid, &uuid, sizeof(uuid));
  d.cuDeviceTotalMem_v2(&prop->totalGlobalMem, device);
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    d.cuDeviceGetAttribute(&v, a, device);
    return v;
  };
  prop->major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  prop->minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  prop->multiProcessorCount = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  prop->warpSize = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  prop->maxThreadsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  prop->totalConstMem = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY));
  prop->textureAlignment = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT));
  prop->texturePitchAlignment = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT));
  prop->memoryBusWidth = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  prop->l2CacheSize = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  prop->asyncEngineCount = attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
  prop->pciBusID = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  prop->unifiedAddressing = attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  prop->canMapHostMemory = attr(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
  prop->managedMemory = attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
  prop->concurrentManagedAccess = attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
  prop->pageableMemoryAccess = attr(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
  prop->concurrentKernels = attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
  prop->memoryPoolsSupported = attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  prop->memoryPoolSupportedHandleTypes =
      static_cast<unsigned int>(attr(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES));
  prop->ipcEventSupported = attr(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED);
  prop->hostRegisterSupported = attr(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
  for (int i = 0; i < 3; ++i) {
    prop->maxThreadsDim[i] = attr(static_cast<CUdevice_attribute>(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + i));
    prop->maxGridSize[i] = attr(static_cast<CUdevice_attribute>(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + i));
  }
  prop->sharedMemPerBlock = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  prop->sharedMemPerBlockOptin = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));
  prop->sharedMemPerMultiprocessor =
      static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR));
  prop->reservedSharedMemPerBlock = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK));
  prop->regsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  prop->regsPerMultiprocessor = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  prop->maxThreadsPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  prop->maxBlocksPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  prop->memPitch = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_MAX_PITCH));
  prop->surfaceAlignment = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT));
  prop->maxTexture1D = attr(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH);
  prop->maxTexture2D[0] = attr(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH);
  prop->maxTexture2D[1] = attr(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT);
  prop->maxTexture3D[0] = attr(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH);
  prop->maxTexture3D[1] = attr(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT);
  prop->maxTexture3D[2] = attr(CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH);
  prop->accessPolicyMaxWindowSize = attr(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE);
  prop->streamPrioritiesSupported = attr(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED);
  prop->globalL1CacheSupported = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED);
  prop->localL1CacheSupported = attr(CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED);
  prop->ECCEnabled = attr(CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
  prop->cooperativeLaunch = attr(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
  prop->computePreemptionSupported = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED);
  prop->canUseHostPointerForRegisteredMem = attr(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
  prop->pciDomainID = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  prop->pciDeviceID = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* runtimeVersion) {
  if (runtimeVersion == nullptr) return Record(cudaErrorInvalidValue);
  *runtimeVersion = kRuntimeVersion;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return Record(cudaErrorInvalidValue);
  // Without a usable driver CUDA reports version 0 rather than failing.
  if (LoadDriver() != cudaSuccess) {
    *driverVersion = 0;
    return cudaSuccess;
  }
  return Record(Translate(Driver().cuDriverGetVersion(driverVersion)));
}

// ---- device flags ----
// cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops;
// they have the CU_CTX_* values of the primary context's flags.
namespace {
constexpr unsigned kDeviceFlags = cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax |
                                  cudaDeviceSyncMemops;
}  // namespace

cudaError_t CUDARTAPI cudaSetDeviceFlags(unsigned int flags) {
  if ((flags & ~kDeviceFlags) != 0) return Record(cudaErrorInvalidValue);
  const unsigned schedule = flags & cudaDeviceScheduleMask;
  if (schedule != cudaDeviceScheduleAuto && schedule != cudaDeviceScheduleSpin && schedule != cudaDeviceScheduleYield &&
      schedule != cudaDeviceScheduleBlockingSync) {
    return Record(cudaErrorInvalidValue);
  }
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  // Host memory is always mappable on CUDA 13: the flag is accepted and kept out of the context.
  return Record(Translate(Driver().cuDevicePrimaryCtxSetFlags_v2(CurrentDevice(), flags & ~cudaDeviceMapHost)));
}

cudaError_t CUDARTAPI cudaGetDeviceFlags(unsigned int* flags) {
  if (flags == nullptr) return Record(cudaErrorInvalidValue);
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  unsigned ctx_flags = 0;
  int active = 0;
  if (CUresult r = Driver().cuDevicePrimaryCtxGetState(CurrentDevice(), &ctx_flags, &active); r != CUDA_SUCCESS) {
    return Record(Translate(r));
  }
  *flags = ctx_flags | cudaDeviceMapHost;
  return cudaSuccess;
}

// ---- peer access ----
cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  return Record(Translate(Driver().cuDeviceCanAccessPeer(canAccessPeer, device, peerDevice)));
}

namespace {
template <typename F>
cudaError_t WithPeerContext(int peerDevice, F&& driver_call) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  int count = 0;
  Driver().cuDeviceGetCount(&count);
  if (peerDevice < 0 || peerDevice >= count) return Record(cudaErrorInvalidDevice);
  CUcontext peer = nullptr;
  if (cudaError_t e = PrimaryContext(peerDevice, &peer); e != cudaSuccess) return Record(e);
  return Record(Translate(driver_call(peer)));
}
}  // namespace

cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  if (flags != 0) return Record(cudaErrorInvalidValue);
  return WithPeerContext(peerDevice, [](CUcontext peer) { return Driver().cuCtxEnablePeerAccess(peer, 0); });
}

cudaError_t CUDARTAPI cudaDeviceDisablePeerAccess(int peerDevice) {
  return WithPeerContext(peerDevice, [](CUcontext peer) { return Driver().cuCtxDisablePeerAccess(peer); });
}
