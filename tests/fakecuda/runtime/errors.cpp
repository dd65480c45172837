// CUresult -> cudaError_t, and cudaGetErrorName / cudaGetErrorString.
//
// Both tables cover every code of CUDA 13.0's headers. Most driver codes have a runtime twin with
// the same number (CUDA_ERROR_OUT_OF_MEMORY -> cudaErrorMemoryAllocation, ...); the few without
// one become cudaErrorUnknown.
#include "runtime.h"

namespace fakecudart {
namespace {

struct Mapping {
  CUresult driver;
  cudaError_t runtime;
};

constexpr Mapping kDriverToRuntime[] = {
    {CUDA_SUCCESS, cudaSuccess},
    {CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue},
    {CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation},
    {CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError},
    {CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading},
    {CUDA_ERROR_PROFILER_DISABLED, cudaErrorProfilerDisabled},
    {CUDA_ERROR_PROFILER_NOT_INITIALIZED, cudaErrorProfilerNotInitialized},
    {CUDA_ERROR_PROFILER_ALREADY_STARTED, cudaErrorProfilerAlreadyStarted},
    {CUDA_ERROR_PROFILER_ALREADY_STOPPED, cudaErrorProfilerAlreadyStopped},
    {CUDA_ERROR_STUB_LIBRARY, cudaErrorStubLibrary},
    {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, cudaErrorCallRequiresNewerDriver},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, cudaErrorDevicesUnavailable},
    {CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice},
    {CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice},
    {CUDA_ERROR_DEVICE_NOT_LICENSED, cudaErrorDeviceNotLicensed},
    {CUDA_ERROR_INVALID_IMAGE, cudaErrorInvalidKernelImage},
    {CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, cudaErrorUnknown},
    {CUDA_ERROR_MAP_FAILED, cudaErrorMapBufferObjectFailed},
    {CUDA_ERROR_UNMAP_FAILED, cudaErrorUnmapBufferObjectFailed},
    {CUDA_ERROR_ARRAY_IS_MAPPED, cudaErrorArrayIsMapped},
    {CUDA_ERROR_ALREADY_MAPPED, cudaErrorAlreadyMapped},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, cudaErrorNoKernelImageForDevice},
    {CUDA_ERROR_ALREADY_ACQUIRED, cudaErrorAlreadyAcquired},
    {CUDA_ERROR_NOT_MAPPED, cudaErrorNotMapped},
    {CUDA_ERROR_NOT_MAPPED_AS_ARRAY, cudaErrorNotMappedAsArray},
    {CUDA_ERROR_NOT_MAPPED_AS_POINTER, cudaErrorNotMappedAsPointer},
    {CUDA_ERROR_ECC_UNCORRECTABLE, cudaErrorECCUncorrectable},
    {CUDA_ERROR_UNSUPPORTED_LIMIT, cudaErrorUnsupportedLimit},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, cudaErrorDeviceAlreadyInUse},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, cudaErrorPeerAccessUnsupported},
    {CUDA_ERROR_INVALID_PTX, cudaErrorInvalidPtx},
    {CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, cudaErrorInvalidGraphicsContext},
    {CUDA_ERROR_NVLINK_UNCORRECTABLE, cudaErrorNvlinkUncorrectable},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, cudaErrorJitCompilerNotFound},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, cudaErrorUnsupportedPtxVersion},
    {CUDA_ERROR_JIT_COMPILATION_DISABLED, cudaErrorJitCompilationDisabled},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, cudaErrorUnsupportedExecAffinity},
    {CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, cudaErrorUnsupportedDevSideSync},
    {CUDA_ERROR_CONTAINED, cudaErrorContained},
    {CUDA_ERROR_INVALID_SOURCE, cudaErrorInvalidSource},
    {CUDA_ERROR_FILE_NOT_FOUND, cudaErrorFileNotFound},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, cudaErrorSharedObjectSymbolNotFound},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, cudaErrorSharedObjectInitFailed},
    {CUDA_ERROR_OPERATING_SYSTEM, cudaErrorOperatingSystem},
    {CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle},
    {CUDA_ERROR_ILLEGAL_STATE, cudaErrorIllegalState},
    {CUDA_ERROR_LOSSY_QUERY, cudaErrorLossyQuery},
    {CUDA_ERROR_NOT_FOUND, cudaErrorSymbolNotFound},
    {CUDA_ERROR_NOT_READY, cudaErrorNotReady},
    {CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, cudaErrorLaunchOutOfResources},
    {CUDA_ERROR_LAUNCH_TIMEOUT, cudaErrorLaunchTimeout},
    {CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, cudaErrorLaunchIncompatibleTexturing},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cudaErrorPeerAccessAlreadyEnabled},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cudaErrorPeerAccessNotEnabled},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, cudaErrorSetOnActiveProcess},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, cudaErrorContextIsDestroyed},  // but see Translate
    {CUDA_ERROR_ASSERT, cudaErrorAssert},
    {CUDA_ERROR_TOO_MANY_PEERS, cudaErrorTooManyPeers},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cudaErrorHostMemoryAlreadyRegistered},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cudaErrorHostMemoryNotRegistered},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, cudaErrorHardwareStackError},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, cudaErrorIllegalInstruction},
    {CUDA_ERROR_MISALIGNED_ADDRESS, cudaErrorMisalignedAddress},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, cudaErrorInvalidAddressSpace},
    {CUDA_ERROR_INVALID_PC, cudaErrorInvalidPc},
    {CUDA_ERROR_LAUNCH_FAILED, cudaErrorLaunchFailure},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, cudaErrorCooperativeLaunchTooLarge},
    {CUDA_ERROR_TENSOR_MEMORY_LEAK, cudaErrorTensorMemoryLeak},
    {CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted},
    {CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported},
    {CUDA_ERROR_SYSTEM_NOT_READY, cudaErrorSystemNotReady},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, cudaErrorSystemDriverMismatch},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, cudaErrorCompatNotSupportedOnDevice},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, cudaErrorMpsConnectionFailed},
    {CUDA_ERROR_MPS_RPC_FAILURE, cudaErrorMpsRpcFailure},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, cudaErrorMpsServerNotReady},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, cudaErrorMpsMaxClientsReached},
    {CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, cudaErrorMpsMaxConnectionsReached},
    {CUDA_ERROR_MPS_CLIENT_TERMINATED, cudaErrorMpsClientTerminated},
    {CUDA_ERROR_CDP_NOT_SUPPORTED, cudaErrorCdpNotSupported},
    {CUDA_ERROR_CDP_VERSION_MISMATCH, cudaErrorCdpVersionMismatch},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cudaErrorStreamCaptureUnsupported},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cudaErrorStreamCaptureInvalidated},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, cudaErrorStreamCaptureMerge},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, cudaErrorStreamCaptureUnmatched},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cudaErrorStreamCaptureUnjoined},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cudaErrorStreamCaptureIsolation},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cudaErrorStreamCaptureImplicit},
    {CUDA_ERROR_CAPTURED_EVENT, cudaErrorCapturedEvent},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, cudaErrorStreamCaptureWrongThread},
    {CUDA_ERROR_TIMEOUT, cudaErrorTimeout},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cudaErrorGraphExecUpdateFailure},
    {CUDA_ERROR_EXTERNAL_DEVICE, cudaErrorExternalDevice},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, cudaErrorInvalidClusterSize},
    {CUDA_ERROR_FUNCTION_NOT_LOADED, cudaErrorFunctionNotLoaded},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, cudaErrorInvalidResourceType},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, cudaErrorInvalidResourceConfiguration},
    {CUDA_ERROR_KEY_ROTATION, cudaErrorUnknown},
    {CUDA_ERROR_UNKNOWN, cudaErrorUnknown},
};

struct ErrorInfo {
  cudaError_t code;
  const char* name;
  const char* description;  // nullptr: use the name
};

constexpr ErrorInfo kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorProfilerDisabled, "cudaErrorProfilerDisabled", nullptr},
    {cudaErrorProfilerNotInitialized, "cudaErrorProfilerNotInitialized", nullptr},
    {cudaErrorProfilerAlreadyStarted, "cudaErrorProfilerAlreadyStarted", nullptr},
    {cudaErrorProfilerAlreadyStopped, "cudaErrorProfilerAlreadyStopped", nullptr},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", nullptr},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", nullptr},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", nullptr},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidTexture, "cudaErrorInvalidTexture", nullptr},
    {cudaErrorInvalidTextureBinding, "cudaErrorInvalidTextureBinding", nullptr},
    {cudaErrorInvalidChannelDescriptor, "cudaErrorInvalidChannelDescriptor", nullptr},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorAddressOfConstant, "cudaErrorAddressOfConstant", nullptr},
    {cudaErrorTextureFetchFailed, "cudaErrorTextureFetchFailed", nullptr},
    {cudaErrorTextureNotBound, "cudaErrorTextureNotBound", nullptr},
    {cudaErrorSynchronizationError, "cudaErrorSynchronizationError", nullptr},
    {cudaErrorInvalidFilterSetting, "cudaErrorInvalidFilterSetting", nullptr},
    {cudaErrorInvalidNormSetting, "cudaErrorInvalidNormSetting", nullptr},
    {cudaErrorMixedDeviceExecution, "cudaErrorMixedDeviceExecution", nullptr},
    {cudaErrorNotYetImplemented, "cudaErrorNotYetImplemented", nullptr},
    {cudaErrorMemoryValueTooLarge, "cudaErrorMemoryValueTooLarge", nullptr},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorCallRequiresNewerDriver, "cudaErrorCallRequiresNewerDriver", nullptr},
    {cudaErrorInvalidSurface, "cudaErrorInvalidSurface", nullptr},
    {cudaErrorDuplicateVariableName, "cudaErrorDuplicateVariableName", nullptr},
    {cudaErrorDuplicateTextureName, "cudaErrorDuplicateTextureName", nullptr},
    {cudaErrorDuplicateSurfaceName, "cudaErrorDuplicateSurfaceName", nullptr},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", nullptr},
    {cudaErrorIncompatibleDriverContext, "cudaErrorIncompatibleDriverContext", nullptr},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration", nullptr},
    {cudaErrorPriorLaunchFailure, "cudaErrorPriorLaunchFailure", nullptr},
    {cudaErrorLaunchMaxDepthExceeded, "cudaErrorLaunchMaxDepthExceeded", nullptr},
    {cudaErrorLaunchFileScopedTex, "cudaErrorLaunchFileScopedTex", nullptr},
    {cudaErrorLaunchFileScopedSurf, "cudaErrorLaunchFileScopedSurf", nullptr},
    {cudaErrorSyncDepthExceeded, "cudaErrorSyncDepthExceeded", nullptr},
    {cudaErrorLaunchPendingCountExceeded, "cudaErrorLaunchPendingCountExceeded", nullptr},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", nullptr},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceNotLicensed, "cudaErrorDeviceNotLicensed", nullptr},
    {cudaErrorSoftwareValidityNotEstablished, "cudaErrorSoftwareValidityNotEstablished", nullptr},
    {cudaErrorStartupFailure, "cudaErrorStartupFailure", nullptr},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", nullptr},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", nullptr},
    {cudaErrorUnmapBufferObjectFailed, "cudaErrorUnmapBufferObjectFailed", nullptr},
    {cudaErrorArrayIsMapped, "cudaErrorArrayIsMapped", nullptr},
    {cudaErrorAlreadyMapped, "cudaErrorAlreadyMapped", "resource already mapped"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", nullptr},
    {cudaErrorAlreadyAcquired, "cudaErrorAlreadyAcquired", nullptr},
    {cudaErrorNotMapped, "cudaErrorNotMapped", "resource not mapped"},
    {cudaErrorNotMappedAsArray, "cudaErrorNotMappedAsArray", nullptr},
    {cudaErrorNotMappedAsPointer, "cudaErrorNotMappedAsPointer", nullptr},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", nullptr},
    {cudaErrorUnsupportedLimit, "cudaErrorUnsupportedLimit", nullptr},
    {cudaErrorDeviceAlreadyInUse, "cudaErrorDeviceAlreadyInUse", nullptr},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported", nullptr},
    {cudaErrorInvalidPtx, "cudaErrorInvalidPtx", nullptr},
    {cudaErrorInvalidGraphicsContext, "cudaErrorInvalidGraphicsContext", nullptr},
    {cudaErrorNvlinkUncorrectable, "cudaErrorNvlinkUncorrectable", nullptr},
    {cudaErrorJitCompilerNotFound, "cudaErrorJitCompilerNotFound", nullptr},
    {cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion", nullptr},
    {cudaErrorJitCompilationDisabled, "cudaErrorJitCompilationDisabled", nullptr},
    {cudaErrorUnsupportedExecAffinity, "cudaErrorUnsupportedExecAffinity", nullptr},
    {cudaErrorUnsupportedDevSideSync, "cudaErrorUnsupportedDevSideSync", nullptr},
    {cudaErrorContained, "cudaErrorContained", nullptr},
    {cudaErrorInvalidSource, "cudaErrorInvalidSource", nullptr},
    {cudaErrorFileNotFound, "cudaErrorFileNotFound", nullptr},
    {cudaErrorSharedObjectSymbolNotFound, "cudaErrorSharedObjectSymbolNotFound", nullptr},
    {cudaErrorSharedObjectInitFailed, "cudaErrorSharedObjectInitFailed", nullptr},
    {cudaErrorOperatingSystem, "cudaErrorOperatingSystem", "OS call failed or operation not supported on this OS"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorLossyQuery, "cudaErrorLossyQuery", nullptr},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", nullptr},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", nullptr},
    {cudaErrorLaunchIncompatibleTexturing, "cudaErrorLaunchIncompatibleTexturing", nullptr},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", nullptr},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", nullptr},
    {cudaErrorSetOnActiveProcess, "cudaErrorSetOnActiveProcess", "cannot set while device is active in this process"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorAssert, "cudaErrorAssert", nullptr},
    {cudaErrorTooManyPeers, "cudaErrorTooManyPeers", nullptr},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", nullptr},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered", nullptr},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", nullptr},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", nullptr},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", nullptr},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace", nullptr},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", nullptr},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorCooperativeLaunchTooLarge, "cudaErrorCooperativeLaunchTooLarge", nullptr},
    {cudaErrorTensorMemoryLeak, "cudaErrorTensorMemoryLeak", nullptr},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSystemNotReady, "cudaErrorSystemNotReady", nullptr},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch", nullptr},
    {cudaErrorCompatNotSupportedOnDevice, "cudaErrorCompatNotSupportedOnDevice", nullptr},
    {cudaErrorMpsConnectionFailed, "cudaErrorMpsConnectionFailed", nullptr},
    {cudaErrorMpsRpcFailure, "cudaErrorMpsRpcFailure", nullptr},
    {cudaErrorMpsServerNotReady, "cudaErrorMpsServerNotReady", nullptr},
    {cudaErrorMpsMaxClientsReached, "cudaErrorMpsMaxClientsReached", nullptr},
    {cudaErrorMpsMaxConnectionsReached, "cudaErrorMpsMaxConnectionsReached", nullptr},
    {cudaErrorMpsClientTerminated, "cudaErrorMpsClientTerminated", nullptr},
    {cudaErrorCdpNotSupported, "cudaErrorCdpNotSupported", nullptr},
    {cudaErrorCdpVersionMismatch, "cudaErrorCdpVersionMismatch", nullptr},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorTimeout, "cudaErrorTimeout", "wait operation timed out"},
    {cudaErrorGraphExecUpdateFailure, "cudaErrorGraphExecUpdateFailure", nullptr},
    {cudaErrorExternalDevice, "cudaErrorExternalDevice", nullptr},
    {cudaErrorInvalidClusterSize, "cudaErrorInvalidClusterSize", nullptr},
    {cudaErrorFunctionNotLoaded, "cudaErrorFunctionNotLoaded", nullptr},
    {cudaErrorInvalidResourceType, "cudaErrorInvalidResourceType", nullptr},
    {cudaErrorInvalidResourceConfiguration, "cudaErrorInvalidResourceConfiguration", nullptr},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorInfo* Find(cudaError_t code) {
  for (const ErrorInfo& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

constexpr const char* kUnrecognized = "unrecognized error code";

}  // namespace

cudaError_t TranslateCode(CUresult r) {
  for (const Mapping& m : kDriverToRuntime) {
    if (m.driver == r) return m.runtime;
  }
  return cudaErrorUnknown;
}

cudaError_t Translate(CUresult r) {
  // Under a context the program made and another thread destroyed, NVIDIA's runtime answers
  // "invalid device context" to cudaMalloc, cudaMallocAsync, cudaFree and cudaFreeAsync where its
  // driver says "context is destroyed" (an H200, 2026-11-29, docs/gpu-validation.md run 8).
  if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED && CurrentContextIsProgramMade()) return cudaErrorDeviceUninitialized;
  return TranslateCode(r);
}

}  // namespace fakecudart

using namespace fakecudart;

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  const ErrorInfo* e = Find(error);
  return e != nullptr ? e->name : kUnrecognized;
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  const ErrorInfo* e = Find(error);
  if (e == nullptr) return kUnrecognized;
  return e->description != nullptr ? e->description : e->name;
}
