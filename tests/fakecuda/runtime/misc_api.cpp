// Pointer attributes, legacy IPC, driver entry points and the test-only delayed fill.
#include <cstring>

#include "runtime.h"

using namespace fakecudart;

namespace {

CUdeviceptr Dev(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// cudaEnableDefault means "legacy" for the plain entry points and "per-thread" for the _ptsz ones,
// like code compiled with or without --default-stream per-thread.
cudaError_t EntryPoint(const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
                       cudaDriverEntryPointQueryResult* driverStatus, bool ptsz) {
  if (symbol == nullptr || funcPtr == nullptr) return Record(cudaErrorInvalidValue);
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  cuuint64_t cu_flags = 0;
  switch (flags) {
    case cudaEnableDefault:
      cu_flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
      break;
    case cudaEnableLegacyStream: cu_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM; break;
    case cudaEnablePerThreadDefaultStream: cu_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; break;
    default: return Record(cudaErrorInvalidValue);
  }
  int driver_version = 0;
  Driver().cuDriverGetVersion(&driver_version);
  if (static_cast<int>(cudaVersion) > driver_version) return Record(cudaErrorInvalidValue);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  const CUresult r =
      Driver().cuGetProcAddress_v2(symbol, funcPtr, static_cast<int>(cudaVersion), cu_flags, &status);
  // A symbol that does not exist (for this version) is not an error: *funcPtr is null and the
  // optional status says why.
  if (r != CUDA_SUCCESS) *funcPtr = nullptr;
  if (driverStatus != nullptr) *driverStatus = static_cast<cudaDriverEntryPointQueryResult>(status);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_FOUND) return Record(Translate(r));
  return cudaSuccess;
}

}  // namespace

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return Record(cudaErrorInvalidValue);
  unsigned int memory_type = 0;
  unsigned int is_managed = 0;
  int device = -2;
  CUdeviceptr device_pointer = 0;
  void* host_pointer = nullptr;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER};
  void* data[] = {&memory_type, &is_managed, &device, &device_pointer, &host_pointer};
  cudaError_t e = Call([&] { return Driver().cuPointerGetAttributes(5, attrs, data, Dev(ptr)); });
  if (e != cudaSuccess) return e;
  std::memset(attributes, 0, sizeof(*attributes));
  if (is_managed != 0) {
    attributes->type = cudaMemoryTypeManaged;
  } else if (memory_type == CU_MEMORYTYPE_DEVICE) {
    attributes->type = cudaMemoryTypeDevice;
  } else if (memory_type == CU_MEMORYTYPE_HOST) {
    attributes->type = cudaMemoryTypeHost;
  } else {
    // CUDA >= 11: plain host memory is not an error, just unregistered.
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->devicePointer = nullptr;
    attributes->hostPointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  attributes->device = device;
  attributes->devicePointer = reinterpret_cast<void*>(device_pointer);
  attributes->hostPointer = host_pointer;
  return cudaSuccess;
}

// ---- legacy IPC (cudaIpcMemHandle_t and CUipcMemHandle are both 64 opaque bytes) ----

cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  if (handle == nullptr) return Record(cudaErrorInvalidValue);
  return Call([&] { return Driver().cuIpcGetMemHandle(reinterpret_cast<CUipcMemHandle*>(handle), Dev(devPtr)); });
}

cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  if (devPtr == nullptr) return Record(cudaErrorInvalidValue);
  CUipcMemHandle cu_handle;
  static_assert(sizeof(cu_handle) == sizeof(handle));
  std::memcpy(&cu_handle, &handle, sizeof(cu_handle));
  CUdeviceptr p = 0;
  cudaError_t e = Call([&] { return Driver().cuIpcOpenMemHandle_v2(&p, cu_handle, flags); });
  if (e == cudaSuccess) *devPtr = reinterpret_cast<void*>(p);
  return e;
}

cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void* devPtr) {
  return Call([&] { return Driver().cuIpcCloseMemHandle(Dev(devPtr)); });
}

// Interprocess events (cudaIpcEventHandle_t and CUipcEventHandle are both 64 opaque bytes).
cudaError_t CUDARTAPI cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  if (handle == nullptr) return Record(cudaErrorInvalidValue);
  return Call([&] {
    return Driver().cuIpcGetEventHandle(reinterpret_cast<CUipcEventHandle*>(handle), reinterpret_cast<CUevent>(event));
  });
}

cudaError_t CUDARTAPI cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  if (event == nullptr) return Record(cudaErrorInvalidValue);
  CUipcEventHandle cu_handle;
  static_assert(sizeof(cu_handle) == sizeof(handle));
  std::memcpy(&cu_handle, &handle, sizeof(cu_handle));
  CUevent opened = nullptr;
  cudaError_t e = Call([&] { return Driver().cuIpcOpenEventHandle(&opened, cu_handle); });
  if (e == cudaSuccess) *event = reinterpret_cast<cudaEvent_t>(opened);
  return e;
}

// ---- driver entry points ----

cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                              enum cudaDriverEntryPointQueryResult* driverStatus) {
  return EntryPoint(symbol, funcPtr, kRuntimeVersion, flags, driverStatus, false);
}
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                                   enum cudaDriverEntryPointQueryResult* driverStatus) {
  return EntryPoint(symbol, funcPtr, kRuntimeVersion, flags, driverStatus, true);
}
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       enum cudaDriverEntryPointQueryResult* driverStatus) {
  return EntryPoint(symbol, funcPtr, cudaVersion, flags, driverStatus, false);
}
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                            unsigned int cudaVersion, unsigned long long flags,
                                                            enum cudaDriverEntryPointQueryResult* driverStatus) {
  return EntryPoint(symbol, funcPtr, cudaVersion, flags, driverStatus, true);
}

// ---- test hook (fakecuda.h) ----

int fakecudaLaunchDelayedFill(void* dst, int value, size_t bytes, unsigned delay_us, cudaStream_t stream) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  if (Driver().fakecuLaunchDelayedFill == nullptr) return Record(cudaErrorNotSupported);
  return Record(Translate(Driver().fakecuLaunchDelayedFill(Dev(dst), value, bytes, delay_us, stream)));
}

// ---- profiler control (cuda_profiler_api.h) ----
cudaError_t CUDARTAPI cudaProfilerStart(void) { return Call([] { return Driver().cuProfilerStart(); }); }
cudaError_t CUDARTAPI cudaProfilerStop(void) { return Call([] { return Driver().cuProfilerStop(); }); }
