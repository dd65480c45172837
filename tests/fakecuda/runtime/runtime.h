// Internal interface of the fake libcudart.so.13.
//
// The runtime owns no device state. Like NVIDIA's libcudart it dlopen()s libcuda.so.1, dlsym()s
// only cuGetProcAddress_v2, and obtains every other driver function through it with a base name,
// an ABI version and stream flags. Every cuda* entry point is implemented by calling those
// function pointers, so a shim that interposes the driver sees everything the runtime does.
//
// cuda_runtime_api.h and cuda.h are included with __CUDA_API_VERSION_INTERNAL so that they declare
// every variant (cudaMemcpyAsync and cudaMemcpyAsync_ptsz, cuMemAlloc_v2, ...) under its real name.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaProfiler.h>
#include <cuda_profiler_api.h>

#include "../fakecuda.h"

namespace fakecudart {

inline constexpr int kRuntimeVersion = 13000;  // CUDART_VERSION of the headers we mimic

// The driver functions the runtime uses:
//   X(variant, base name asked for, cudaVersion asked for, cuGetProcAddress flags, required)
// `variant` is the exported name the answer should be (and the member's name in DriverApi).
// Flags 2 = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, for the runtime's _ptsz/_ptds entries.
// clang-format off
#define FAKECUDART_DRIVER_FUNCTIONS(X)                                                   \
  X(cuGetProcAddress_v2,               "cuGetProcAddress",              12000, 0, true)  \
  X(cuInit,                            "cuInit",                         2000, 0, true)  \
  X(cuDriverGetVersion,                "cuDriverGetVersion",             2020, 0, true)  \
  X(cuGetExportTable,                  "cuGetExportTable",               3000, 0, false) \
  X(cuDeviceGet,                       "cuDeviceGet",                    2000, 0, true)  \
  X(cuDeviceGetCount,                  "cuDeviceGetCount",               2000, 0, true)  \
  X(cuDeviceGetName,                   "cuDeviceGetName",                2000, 0, true)  \
  X(cuDeviceTotalMem_v2,               "cuDeviceTotalMem",               3020, 0, true)  \
  X(cuDeviceGetAttribute,              "cuDeviceGetAttribute",           2000, 0, true)  \
  X(cuDeviceGetUuid_v2,                "cuDeviceGetUuid",               11040, 0, true)  \
  X(cuDevicePrimaryCtxRetain,          "cuDevicePrimaryCtxRetain",       7000, 0, true)  \
  X(cuDevicePrimaryCtxRelease_v2,      "cuDevicePrimaryCtxRelease",     11000, 0, true)  \
  X(cuDevicePrimaryCtxReset_v2,        "cuDevicePrimaryCtxReset",       11000, 0, true)  \
  X(cuCtxGetCurrent,                   "cuCtxGetCurrent",                4000, 0, true)  \
  X(cuCtxSetCurrent,                   "cuCtxSetCurrent",                4000, 0, true)  \
  X(cuCtxGetDevice,                    "cuCtxGetDevice",                 2000, 0, true)  \
  X(cuCtxSynchronize,                  "cuCtxSynchronize",               2000, 0, true)  \
  X(cuMemGetInfo_v2,                   "cuMemGetInfo",                   3020, 0, true)  \
  X(cuMemAlloc_v2,                     "cuMemAlloc",                     3020, 0, true)  \
  X(cuMemAllocPitch_v2,                "cuMemAllocPitch",                3020, 0, true)  \
  X(cuMemFree_v2,                      "cuMemFree",                      3020, 0, true)  \
  X(cuMemAllocManaged,                 "cuMemAllocManaged",              6000, 0, true)  \
  X(cuMemHostAlloc,                    "cuMemHostAlloc",                 2020, 0, true)  \
  X(cuMemFreeHost,                     "cuMemFreeHost",                  2000, 0, true)  \
  X(cuMemHostGetDevicePointer_v2,      "cuMemHostGetDevicePointer",      3020, 0, true)  \
  X(cuArray3DCreate_v2,                "cuArray3DCreate",                3020, 0, true)  \
  X(cuArrayDestroy,                    "cuArrayDestroy",                 2000, 0, true)  \
  X(cuMipmappedArrayCreate,            "cuMipmappedArrayCreate",         5000, 0, true)  \
  X(cuMipmappedArrayDestroy,           "cuMipmappedArrayDestroy",        5000, 0, true)  \
  X(cuMemAllocAsync,                   "cuMemAllocAsync",               11020, 0, true)  \
  X(cuMemAllocAsync_ptsz,              "cuMemAllocAsync",               11020, 2, true)  \
  X(cuMemAllocFromPoolAsync,           "cuMemAllocFromPoolAsync",       11020, 0, true)  \
  X(cuMemAllocFromPoolAsync_ptsz,      "cuMemAllocFromPoolAsync",       11020, 2, true)  \
  X(cuMemFreeAsync,                    "cuMemFreeAsync",                11020, 0, true)  \
  X(cuMemFreeAsync_ptsz,               "cuMemFreeAsync",                11020, 2, true)  \
  X(cuDeviceGetDefaultMemPool,         "cuDeviceGetDefaultMemPool",     11020, 0, true)  \
  X(cuDeviceGetMemPool,                "cuDeviceGetMemPool",            11020, 0, true)  \
  X(cuDeviceSetMemPool,                "cuDeviceSetMemPool",            11020, 0, true)  \
  X(cuMemPoolCreate,                   "cuMemPoolCreate",               11020, 0, true)  \
  X(cuMemPoolDestroy,                  "cuMemPoolDestroy",              11020, 0, true)  \
  X(cuMemPoolTrimTo,                   "cuMemPoolTrimTo",               11020, 0, true)  \
  X(cuMemPoolSetAccess,                "cuMemPoolSetAccess",            11020, 0, true)  \
  X(cuMemPoolGetAccess,                "cuMemPoolGetAccess",            11020, 0, true)  \
  X(cuMemPoolGetAttribute,             "cuMemPoolGetAttribute",         11020, 0, true)  \
  X(cuMemPoolSetAttribute,             "cuMemPoolSetAttribute",         11020, 0, true)  \
  X(cuGraphAddMemAllocNode,            "cuGraphAddMemAllocNode",        11040, 0, false) \
  X(cuDeviceGraphMemTrim,              "cuDeviceGraphMemTrim",          11040, 0, false) \
  X(cuMemcpy,                          "cuMemcpy",                       4000, 0, true)  \
  X(cuMemcpy_ptds,                     "cuMemcpy",                       4000, 2, true)  \
  X(cuMemcpyAsync,                     "cuMemcpyAsync",                  4000, 0, true)  \
  X(cuMemcpyAsync_ptsz,                "cuMemcpyAsync",                  4000, 2, true)  \
  X(cuMemcpyHtoD_v2,                   "cuMemcpyHtoD",                   3020, 0, true)  \
  X(cuMemcpyHtoD_v2_ptds,              "cuMemcpyHtoD",                   3020, 2, true)  \
  X(cuMemcpyDtoH_v2,                   "cuMemcpyDtoH",                   3020, 0, true)  \
  X(cuMemcpyDtoH_v2_ptds,              "cuMemcpyDtoH",                   3020, 2, true)  \
  X(cuMemcpyDtoD_v2,                   "cuMemcpyDtoD",                   3020, 0, true)  \
  X(cuMemcpyDtoD_v2_ptds,              "cuMemcpyDtoD",                   3020, 2, true)  \
  X(cuMemcpyHtoDAsync_v2,              "cuMemcpyHtoDAsync",              3020, 0, true)  \
  X(cuMemcpyHtoDAsync_v2_ptsz,         "cuMemcpyHtoDAsync",              3020, 2, true)  \
  X(cuMemcpyDtoHAsync_v2,              "cuMemcpyDtoHAsync",              3020, 0, true)  \
  X(cuMemcpyDtoHAsync_v2_ptsz,         "cuMemcpyDtoHAsync",              3020, 2, true)  \
  X(cuMemcpyDtoDAsync_v2,              "cuMemcpyDtoDAsync",              3020, 0, true)  \
  X(cuMemcpyDtoDAsync_v2_ptsz,         "cuMemcpyDtoDAsync",              3020, 2, true)  \
  X(cuMemsetD8_v2,                     "cuMemsetD8",                     3020, 0, true)  \
  X(cuMemsetD8_v2_ptds,                "cuMemsetD8",                     3020, 2, true)  \
  X(cuMemsetD8Async,                   "cuMemsetD8Async",                3020, 0, true)  \
  X(cuMemsetD8Async_ptsz,              "cuMemsetD8Async",                3020, 2, true)  \
  X(cuStreamCreate,                    "cuStreamCreate",                 2000, 0, true)  \
  X(cuStreamCreateWithPriority,        "cuStreamCreateWithPriority",     5050, 0, true)  \
  X(cuStreamDestroy_v2,                "cuStreamDestroy",                4000, 0, true)  \
  X(cuStreamSynchronize,               "cuStreamSynchronize",            2000, 0, true)  \
  X(cuStreamSynchronize_ptsz,          "cuStreamSynchronize",            2000, 2, true)  \
  X(cuStreamQuery,                     "cuStreamQuery",                  2000, 0, true)  \
  X(cuStreamQuery_ptsz,                "cuStreamQuery",                  2000, 2, true)  \
  X(cuStreamWaitEvent,                 "cuStreamWaitEvent",              3020, 0, true)  \
  X(cuStreamWaitEvent_ptsz,            "cuStreamWaitEvent",              3020, 2, true)  \
  X(cuStreamGetFlags,                  "cuStreamGetFlags",               5050, 0, true)  \
  X(cuStreamGetFlags_ptsz,             "cuStreamGetFlags",               5050, 2, true)  \
  X(cuStreamBeginCapture_v2,           "cuStreamBeginCapture",          10010, 0, true)  \
  X(cuStreamBeginCapture_v2_ptsz,      "cuStreamBeginCapture",          10010, 2, true)  \
  X(cuStreamEndCapture,                "cuStreamEndCapture",            10000, 0, true)  \
  X(cuStreamEndCapture_ptsz,           "cuStreamEndCapture",            10000, 2, true)  \
  X(cuStreamIsCapturing,               "cuStreamIsCapturing",           10000, 0, true)  \
  X(cuStreamIsCapturing_ptsz,          "cuStreamIsCapturing",           10000, 2, true)  \
  X(cuStreamGetCaptureInfo_v3,         "cuStreamGetCaptureInfo",        12030, 0, true)  \
  X(cuStreamGetCaptureInfo_v3_ptsz,    "cuStreamGetCaptureInfo",        12030, 2, true)  \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010, 0, true) \
  X(cuEventCreate,                     "cuEventCreate",                  2000, 0, true)  \
  X(cuEventRecordWithFlags,            "cuEventRecordWithFlags",        11010, 0, true)  \
  X(cuEventRecordWithFlags_ptsz,       "cuEventRecordWithFlags",        11010, 2, true)  \
  X(cuEventQuery,                      "cuEventQuery",                   2000, 0, true)  \
  X(cuEventSynchronize,                "cuEventSynchronize",             2000, 0, true)  \
  X(cuEventDestroy_v2,                 "cuEventDestroy",                 4000, 0, true)  \
  X(cuEventElapsedTime_v2,             "cuEventElapsedTime",            12080, 0, true)  \
  X(cuLaunchHostFunc,                  "cuLaunchHostFunc",              10000, 0, true)  \
  X(cuLaunchHostFunc_ptsz,             "cuLaunchHostFunc",              10000, 2, true)  \
  X(cuGraphInstantiateWithFlags,       "cuGraphInstantiateWithFlags",   11040, 0, true)  \
  X(cuGraphLaunch,                     "cuGraphLaunch",                 10000, 0, true)  \
  X(cuGraphLaunch_ptsz,                "cuGraphLaunch",                 10000, 2, true)  \
  X(cuGraphDestroy,                    "cuGraphDestroy",                10000, 0, true)  \
  X(cuGraphExecDestroy,                "cuGraphExecDestroy",            10000, 0, true)  \
  X(cuPointerGetAttributes,            "cuPointerGetAttributes",         7000, 0, true)  \
  X(cuIpcGetMemHandle,                 "cuIpcGetMemHandle",              4010, 0, true)  \
  X(cuIpcOpenMemHandle,                "cuIpcOpenMemHandle",             4010, 0, false) \
  X(cuIpcOpenMemHandle_v2,             "cuIpcOpenMemHandle",            11000, 0, true)  \
  X(cuIpcCloseMemHandle,               "cuIpcCloseMemHandle",            4010, 0, true)  \
  X(cuMemHostRegister_v2,              "cuMemHostRegister",              6050, 0, true)  \
  X(cuMemHostUnregister,               "cuMemHostUnregister",            4000, 0, true)  \
  X(cuDeviceCanAccessPeer,             "cuDeviceCanAccessPeer",          4000, 0, true)  \
  X(cuCtxEnablePeerAccess,             "cuCtxEnablePeerAccess",          4000, 0, true)  \
  X(cuCtxDisablePeerAccess,            "cuCtxDisablePeerAccess",         4000, 0, true)  \
  X(cuStreamAddCallback,               "cuStreamAddCallback",            5000, 0, true)  \
  X(cuStreamAddCallback_ptsz,          "cuStreamAddCallback",            5000, 2, true)  \
  X(cuProfilerStart,                   "cuProfilerStart",                4000, 0, true)  \
  X(cuProfilerStop,                    "cuProfilerStop",                 4000, 0, true)  \
  X(cuDevicePrimaryCtxSetFlags_v2,     "cuDevicePrimaryCtxSetFlags",    11000, 0, true)  \
  X(cuDevicePrimaryCtxGetState,        "cuDevicePrimaryCtxGetState",     7000, 0, true)  \
  X(cuIpcGetEventHandle,               "cuIpcGetEventHandle",            4010, 0, true)  \
  X(cuIpcOpenEventHandle,              "cuIpcOpenEventHandle",           4010, 0, true)  \
  X(cuGraphCreate,                     "cuGraphCreate",                 10000, 0, true)  \
  X(cuGraphAddEmptyNode,               "cuGraphAddEmptyNode",           10000, 0, true)  \
  X(cuGraphAddHostNode,                "cuGraphAddHostNode",            10000, 0, true)  \
  X(cuGraphAddMemsetNode,              "cuGraphAddMemsetNode",          10000, 0, true)  \
  X(cuGraphAddMemcpyNode,              "cuGraphAddMemcpyNode",          10000, 0, true)  \
  X(cuGraphAddKernelNode_v2,           "cuGraphAddKernelNode",          12000, 0, true)  \
  X(cuGraphAddMemFreeNode,             "cuGraphAddMemFreeNode",         11040, 0, true)  \
  X(cuGraphClone,                      "cuGraphClone",                  10000, 0, true)  \
  X(cuGraphGetNodes,                   "cuGraphGetNodes",               10000, 0, true)  \
  X(cuModuleLoadData,                  "cuModuleLoadData",               2000, 0, true)  \
  X(cuModuleUnload,                    "cuModuleUnload",                 2000, 0, true)  \
  X(cuModuleGetFunction,               "cuModuleGetFunction",            2000, 0, true)  \
  X(cuFuncGetAttribute,                "cuFuncGetAttribute",             2020, 0, true)  \
  X(cuLaunchKernel,                    "cuLaunchKernel",                 4000, 0, true)  \
  X(cuLaunchKernel_ptsz,               "cuLaunchKernel",                 4000, 2, true)  \
  X(fakecuSetKernelStandIn,            "fakecuSetKernelStandIn",        13000, 0, false) \
  X(fakecuLaunchDelayedFill,           "fakecuLaunchDelayedFill",       13000, 0, false)
// clang-format on

struct DriverApi {
#define FAKECUDART_DRIVER_FIELD(variant, name, version, flags, required) decltype(&::variant) variant = nullptr;
  FAKECUDART_DRIVER_FUNCTIONS(FAKECUDART_DRIVER_FIELD)
#undef FAKECUDART_DRIVER_FIELD
};

// ---- driver.cpp ----
// Loads and initializes the driver once per process. cudaErrorInsufficientDriver when libcuda.so.1
// is missing or lacks something the runtime needs.
cudaError_t LoadDriver();
// The resolved driver functions; only valid after LoadDriver() returned cudaSuccess.
const DriverApi& Driver();

// ---- errors.cpp ----
// The runtime's code for a driver's answer to a call the calling thread made (it asks the driver
// which context is current for CUDA_ERROR_CONTEXT_IS_DESTROYED); TranslateCode: the table alone,
// for a status that reaches a callback, where no driver call may be made.
cudaError_t Translate(CUresult r);
cudaError_t TranslateCode(CUresult r);

// ---- state.cpp ----
// Records a failure as the calling thread's last error (cudaGetLastError); returns `e`.
cudaError_t Record(cudaError_t e);
inline cudaError_t Record(CUresult r) { return Record(Translate(r)); }
// The calling thread's current context is not a primary one the runtime knows (the driver loaded).
bool CurrentContextIsProgramMade();
// Driver loaded and the calling thread bound to the primary context of its current device
// (retained once per device per process), as on the first runtime call of a thread.
cudaError_t EnsureContext();
// cudaSetDevice: selects `device` for the calling thread and makes its primary context current.
cudaError_t SelectDevice(int device);
int CurrentDevice();
// The primary context of `device`, retained once per process (what the runtime binds threads to).
cudaError_t PrimaryContext(int device, CUcontext* out);
// After cuDevicePrimaryCtxReset: every thread must rebind before its next call.
void ForgetPrimaryContext(int device);
// The runtime's teardown at exit: the primary contexts it retained are released
// (fakecudaReleaseContextsAtTeardown; off by default).
void TeardownContexts();

// The usual shape of an entry point: initialize, call the driver, translate, record.
template <typename F>
cudaError_t Call(F&& driver_call) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  return Record(Translate(driver_call()));
}

}  // namespace fakecudart
