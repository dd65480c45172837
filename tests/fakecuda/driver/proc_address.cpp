// cuGetProcAddress / cuGetProcAddress_v2: how the runtime (and libraries carrying a static copy of
// it) find every driver function.
//
// Callers ask with a *base* name ("cuMemAlloc"), the CUDA version whose ABI they were built for,
// and flags choosing the default-stream flavour. The answer is the newest variant introduced at or
// before that version; CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects the _ptsz/_ptds
// variant where one exists. Each row below is one exported variant; add rows to extend.
#include <cstring>

#include "driver.h"

#include <cudaProfiler.h>  // after driver.h: cuda.h must see __CUDA_API_VERSION_INTERNAL first
#include "../fakecuda.h"

namespace fakecuda {
namespace {

struct ProcEntry {
  const char* name;   // base name callers ask for
  int version;        // CUDA version that introduced this variant (e.g. 3020 for the _v2 ABI)
  void* legacy;       // default / legacy-stream variant
  void* per_thread;   // _ptsz/_ptds variant, or nullptr when the function takes no stream
};

template <typename F>
void* Fn(F* f) {
  return reinterpret_cast<void*>(f);
}

// clang-format off
const ProcEntry kProcTable[] = {
    // name                                   since  default variant                              per-thread variant
    {"cuInit",                                 2000, Fn(cuInit),                                  nullptr},
    {"cuDriverGetVersion",                     2020, Fn(cuDriverGetVersion),                      nullptr},
    {"cuGetErrorString",                       6000, Fn(cuGetErrorString),                        nullptr},
    {"cuGetErrorName",                         6000, Fn(cuGetErrorName),                          nullptr},
    {"cuGetProcAddress",                      11030, Fn(cuGetProcAddress),                        nullptr},
    {"cuGetProcAddress",                      12000, Fn(cuGetProcAddress_v2),                     nullptr},
    {"cuGetExportTable",                       3000, Fn(cuGetExportTable),                        nullptr},
    // devices
    {"cuDeviceGet",                            2000, Fn(cuDeviceGet),                             nullptr},
    {"cuDeviceGetCount",                       2000, Fn(cuDeviceGetCount),                        nullptr},
    {"cuDeviceGetName",                        2000, Fn(cuDeviceGetName),                         nullptr},
    {"cuDeviceGetUuid",                        9020, Fn(cuDeviceGetUuid),                         nullptr},
    {"cuDeviceGetUuid",                       11040, Fn(cuDeviceGetUuid_v2),                      nullptr},
    {"cuDeviceGetPCIBusId",                    4010, Fn(cuDeviceGetPCIBusId),                     nullptr},
    {"cuDeviceTotalMem",                       3020, Fn(cuDeviceTotalMem_v2),                     nullptr},
    {"cuDeviceGetAttribute",                   2000, Fn(cuDeviceGetAttribute),                    nullptr},
    // contexts
    {"cuDevicePrimaryCtxRetain",               7000, Fn(cuDevicePrimaryCtxRetain),                nullptr},
    {"cuDevicePrimaryCtxRelease",              7000, Fn(cuDevicePrimaryCtxRelease),               nullptr},
    {"cuDevicePrimaryCtxRelease",             11000, Fn(cuDevicePrimaryCtxRelease_v2),            nullptr},
    {"cuDevicePrimaryCtxReset",                7000, Fn(cuDevicePrimaryCtxReset),                 nullptr},
    {"cuDevicePrimaryCtxReset",               11000, Fn(cuDevicePrimaryCtxReset_v2),              nullptr},
    {"cuDevicePrimaryCtxGetState",             7000, Fn(cuDevicePrimaryCtxGetState),              nullptr},
    {"cuDevicePrimaryCtxSetFlags",            11000, Fn(cuDevicePrimaryCtxSetFlags_v2),           nullptr},
    {"cuCtxGetCurrent",                        4000, Fn(cuCtxGetCurrent),                         nullptr},
    {"cuCtxSetCurrent",                        4000, Fn(cuCtxSetCurrent),                         nullptr},
    {"cuCtxPushCurrent",                       4000, Fn(cuCtxPushCurrent_v2),                     nullptr},
    {"cuCtxPopCurrent",                        4000, Fn(cuCtxPopCurrent_v2),                      nullptr},
    {"cuCtxGetDevice",                         2000, Fn(cuCtxGetDevice),                          nullptr},
    {"cuCtxSynchronize",                       2000, Fn(cuCtxSynchronize),                        nullptr},
    {"cuCtxGetStreamPriorityRange",            5050, Fn(cuCtxGetStreamPriorityRange),            nullptr},
    // memory
    {"cuMemGetInfo",                           3020, Fn(cuMemGetInfo_v2),                         nullptr},
    {"cuMemAlloc",                             3020, Fn(cuMemAlloc_v2),                           nullptr},
    {"cuMemAllocPitch",                        3020, Fn(cuMemAllocPitch_v2),                      nullptr},
    {"cuMemFree",                              3020, Fn(cuMemFree_v2),                            nullptr},
    {"cuMemGetAddressRange",                   3020, Fn(cuMemGetAddressRange_v2),                 nullptr},
    {"cuMemAllocHost",                         3020, Fn(cuMemAllocHost_v2),                       nullptr},
    {"cuMemHostAlloc",                         2020, Fn(cuMemHostAlloc),                          nullptr},
    {"cuMemFreeHost",                          2000, Fn(cuMemFreeHost),                           nullptr},
    // CUDA arrays (arrays.cpp)
    {"cuArrayCreate",                          3020, Fn(cuArrayCreate_v2),                        nullptr},
    {"cuArray3DCreate",                        3020, Fn(cuArray3DCreate_v2),                      nullptr},
    {"cuArrayGetDescriptor",                   3020, Fn(cuArrayGetDescriptor_v2),                 nullptr},
    {"cuArray3DGetDescriptor",                 3020, Fn(cuArray3DGetDescriptor_v2),               nullptr},
    {"cuArrayDestroy",                         2000, Fn(cuArrayDestroy),                          nullptr},
    {"cuArrayGetMemoryRequirements",          11060, Fn(cuArrayGetMemoryRequirements),           nullptr},
    {"cuMipmappedArrayCreate",                 5000, Fn(cuMipmappedArrayCreate),                  nullptr},
    {"cuMipmappedArrayDestroy",                5000, Fn(cuMipmappedArrayDestroy),                 nullptr},
    {"cuMipmappedArrayGetMemoryRequirements", 11060, Fn(cuMipmappedArrayGetMemoryRequirements),  nullptr},
    {"cuMemHostGetDevicePointer",              3020, Fn(cuMemHostGetDevicePointer_v2),            nullptr},
    {"cuMemAllocManaged",                      6000, Fn(cuMemAllocManaged),                       nullptr},
    {"cuMemAllocAsync",                       11020, Fn(cuMemAllocAsync),                         Fn(cuMemAllocAsync_ptsz)},
    {"cuMemAllocFromPoolAsync",               11020, Fn(cuMemAllocFromPoolAsync),                 Fn(cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemFreeAsync",                        11020, Fn(cuMemFreeAsync),                          Fn(cuMemFreeAsync_ptsz)},
    {"cuDeviceGetDefaultMemPool",             11020, Fn(cuDeviceGetDefaultMemPool),               nullptr},
    {"cuDeviceGetMemPool",                    11020, Fn(cuDeviceGetMemPool),                      nullptr},
    {"cuDeviceSetMemPool",                    11020, Fn(cuDeviceSetMemPool),                      nullptr},
    {"cuMemPoolCreate",                       11020, Fn(cuMemPoolCreate),                         nullptr},
    {"cuMemPoolDestroy",                      11020, Fn(cuMemPoolDestroy),                        nullptr},
    {"cuMemPoolTrimTo",                       11020, Fn(cuMemPoolTrimTo),                         nullptr},
    {"cuMemPoolSetAccess",                    11020, Fn(cuMemPoolSetAccess),                      nullptr},
    {"cuMemPoolGetAccess",                    11020, Fn(cuMemPoolGetAccess),                      nullptr},
    {"cuMemPoolGetAttribute",                 11020, Fn(cuMemPoolGetAttribute),                   nullptr},
    {"cuMemPoolSetAttribute",                 11020, Fn(cuMemPoolSetAttribute),                   nullptr},
    // copies and memsets (synchronous ones have _ptds, asynchronous ones _ptsz variants)
    {"cuMemcpy",                               4000, Fn(cuMemcpy),                                Fn(cuMemcpy_ptds)},
    {"cuMemcpyAsync",                          4000, Fn(cuMemcpyAsync),                           Fn(cuMemcpyAsync_ptsz)},
    {"cuMemcpyHtoD",                           3020, Fn(cuMemcpyHtoD_v2),                         Fn(cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyDtoH",                           3020, Fn(cuMemcpyDtoH_v2),                         Fn(cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyDtoD",                           3020, Fn(cuMemcpyDtoD_v2),                         Fn(cuMemcpyDtoD_v2_ptds)},
    {"cuMemcpyHtoDAsync",                      3020, Fn(cuMemcpyHtoDAsync_v2),                    Fn(cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync",                      3020, Fn(cuMemcpyDtoHAsync_v2),                    Fn(cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync",                      3020, Fn(cuMemcpyDtoDAsync_v2),                    Fn(cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuMemsetD8",                             3020, Fn(cuMemsetD8_v2),                           Fn(cuMemsetD8_v2_ptds)},
    {"cuMemsetD16",                            3020, Fn(cuMemsetD16_v2),                          Fn(cuMemsetD16_v2_ptds)},
    {"cuMemsetD32",                            3020, Fn(cuMemsetD32_v2),                          Fn(cuMemsetD32_v2_ptds)},
    {"cuMemsetD8Async",                        3020, Fn(cuMemsetD8Async),                         Fn(cuMemsetD8Async_ptsz)},
    {"cuMemsetD16Async",                       3020, Fn(cuMemsetD16Async),                        Fn(cuMemsetD16Async_ptsz)},
    {"cuMemsetD32Async",                       3020, Fn(cuMemsetD32Async),                        Fn(cuMemsetD32Async_ptsz)},
    {"cuLaunchHostFunc",                      10000, Fn(cuLaunchHostFunc),                        Fn(cuLaunchHostFunc_ptsz)},
    // streams
    {"cuStreamCreate",                         2000, Fn(cuStreamCreate),                          nullptr},
    {"cuStreamCreateWithPriority",             5050, Fn(cuStreamCreateWithPriority),              nullptr},
    {"cuStreamDestroy",                        2000, Fn(cuStreamDestroy),                         nullptr},
    {"cuStreamDestroy",                        4000, Fn(cuStreamDestroy_v2),                      nullptr},
    {"cuStreamSynchronize",                    2000, Fn(cuStreamSynchronize),                     Fn(cuStreamSynchronize_ptsz)},
    {"cuStreamQuery",                          2000, Fn(cuStreamQuery),                           Fn(cuStreamQuery_ptsz)},
    {"cuStreamWaitEvent",                      3020, Fn(cuStreamWaitEvent),                       Fn(cuStreamWaitEvent_ptsz)},
    {"cuStreamGetFlags",                       5050, Fn(cuStreamGetFlags),                        Fn(cuStreamGetFlags_ptsz)},
    {"cuStreamGetPriority",                    5050, Fn(cuStreamGetPriority),                     Fn(cuStreamGetPriority_ptsz)},
    {"cuStreamGetCtx",                         9020, Fn(cuStreamGetCtx),                          Fn(cuStreamGetCtx_ptsz)},
    // stream capture and graphs
    {"cuStreamBeginCapture",                  10000, Fn(cuStreamBeginCapture),                    Fn(cuStreamBeginCapture_ptsz)},
    {"cuStreamBeginCapture",                  10010, Fn(cuStreamBeginCapture_v2),                 Fn(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamEndCapture",                    10000, Fn(cuStreamEndCapture),                      Fn(cuStreamEndCapture_ptsz)},
    {"cuStreamIsCapturing",                   10000, Fn(cuStreamIsCapturing),                     Fn(cuStreamIsCapturing_ptsz)},
    {"cuStreamGetCaptureInfo",                11030, Fn(cuStreamGetCaptureInfo_v2),               Fn(cuStreamGetCaptureInfo_v2_ptsz)},
    {"cuStreamGetCaptureInfo",                12030, Fn(cuStreamGetCaptureInfo_v3),               Fn(cuStreamGetCaptureInfo_v3_ptsz)},
    {"cuThreadExchangeStreamCaptureMode",     10010, Fn(cuThreadExchangeStreamCaptureMode),       nullptr},
    {"cuGraphCreate",                         10000, Fn(cuGraphCreate),                           nullptr},
    {"cuGraphDestroy",                        10000, Fn(cuGraphDestroy),                          nullptr},
    {"cuGraphInstantiateWithFlags",           11040, Fn(cuGraphInstantiateWithFlags),             nullptr},
    {"cuGraphInstantiate",                    12000, Fn(cuGraphInstantiateWithFlags),             nullptr},
    {"cuGraphLaunch",                         10000, Fn(cuGraphLaunch),                           Fn(cuGraphLaunch_ptsz)},
    {"cuGraphExecDestroy",                    10000, Fn(cuGraphExecDestroy),                      nullptr},
    {"cuGraphAddMemAllocNode",                11040, Fn(cuGraphAddMemAllocNode),                  nullptr},
    {"cuDeviceGraphMemTrim",                  11040, Fn(cuDeviceGraphMemTrim),                    nullptr},
    // events
    {"cuEventCreate",                          2000, Fn(cuEventCreate),                           nullptr},
    {"cuEventRecord",                          2000, Fn(cuEventRecord),                           Fn(cuEventRecord_ptsz)},
    {"cuEventRecordWithFlags",                11010, Fn(cuEventRecordWithFlags),                  Fn(cuEventRecordWithFlags_ptsz)},
    {"cuEventQuery",                           2000, Fn(cuEventQuery),                            nullptr},
    {"cuEventSynchronize",                     2000, Fn(cuEventSynchronize),                      nullptr},
    {"cuEventDestroy",                         4000, Fn(cuEventDestroy_v2),                       nullptr},
    {"cuEventElapsedTime",                     2000, Fn(cuEventElapsedTime),                      nullptr},
    {"cuEventElapsedTime",                    12080, Fn(cuEventElapsedTime_v2),                   nullptr},
    // virtual memory management
    {"cuMemAddressReserve",                   10020, Fn(cuMemAddressReserve),                     nullptr},
    {"cuMemAddressFree",                      10020, Fn(cuMemAddressFree),                        nullptr},
    {"cuMemCreate",                           10020, Fn(cuMemCreate),                             nullptr},
    {"cuMemRelease",                          10020, Fn(cuMemRelease),                            nullptr},
    {"cuMemMap",                              10020, Fn(cuMemMap),                                nullptr},
    {"cuMemUnmap",                            10020, Fn(cuMemUnmap),                              nullptr},
    {"cuMemSetAccess",                        10020, Fn(cuMemSetAccess),                          nullptr},
    {"cuMemGetAccess",                        10020, Fn(cuMemGetAccess),                          nullptr},
    {"cuMemGetAllocationGranularity",         10020, Fn(cuMemGetAllocationGranularity),           nullptr},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, Fn(cuMemGetAllocationPropertiesFromHandle), nullptr},
    {"cuMemRetainAllocationHandle",           11000, Fn(cuMemRetainAllocationHandle),             nullptr},
    {"cuMemExportToShareableHandle",          10020, Fn(cuMemExportToShareableHandle),            nullptr},
    {"cuMemImportFromShareableHandle",        10020, Fn(cuMemImportFromShareableHandle),          nullptr},
    // pointers and IPC
    {"cuPointerGetAttribute",                  4000, Fn(cuPointerGetAttribute),                   nullptr},
    {"cuPointerGetAttributes",                 7000, Fn(cuPointerGetAttributes),                  nullptr},
    {"cuIpcGetMemHandle",                      4010, Fn(cuIpcGetMemHandle),                       nullptr},
    {"cuIpcOpenMemHandle",                     4010, Fn(cuIpcOpenMemHandle),                      nullptr},
    {"cuIpcOpenMemHandle",                    11000, Fn(cuIpcOpenMemHandle_v2),                   nullptr},
    {"cuIpcCloseMemHandle",                    4010, Fn(cuIpcCloseMemHandle),                     nullptr},
    // test-only hooks of the fake (see fakecuda.h)
    // host registration (host_register.cpp)
    {"cuMemHostRegister",                      4000, Fn(cuMemHostRegister),                       nullptr},
    {"cuMemHostRegister",                      6050, Fn(cuMemHostRegister_v2),                    nullptr},
    {"cuMemHostUnregister",                    4000, Fn(cuMemHostUnregister),                     nullptr},
    // peer access, stream callbacks, profiler
    {"cuDeviceCanAccessPeer",                  4000, Fn(cuDeviceCanAccessPeer),                   nullptr},
    {"cuCtxEnablePeerAccess",                  4000, Fn(cuCtxEnablePeerAccess),                   nullptr},
    {"cuCtxDisablePeerAccess",                 4000, Fn(cuCtxDisablePeerAccess),                  nullptr},
    {"cuStreamAddCallback",                    5000, Fn(cuStreamAddCallback),                     Fn(cuStreamAddCallback_ptsz)},
    {"cuProfilerStart",                        4000, Fn(cuProfilerStart),                         nullptr},
    {"cuProfilerStop",                         4000, Fn(cuProfilerStop),                          nullptr},
    {"cuIpcGetEventHandle",                    4010, Fn(cuIpcGetEventHandle),                     nullptr},
    {"cuIpcOpenEventHandle",                   4010, Fn(cuIpcOpenEventHandle),                    nullptr},
    // explicit graphs (graph_nodes.cpp)
    {"cuGraphAddEmptyNode",                   10000, Fn(cuGraphAddEmptyNode),                     nullptr},
    {"cuGraphAddHostNode",                    10000, Fn(cuGraphAddHostNode),                      nullptr},
    {"cuGraphAddMemsetNode",                  10000, Fn(cuGraphAddMemsetNode),                    nullptr},
    {"cuGraphAddMemcpyNode",                  10000, Fn(cuGraphAddMemcpyNode),                    nullptr},
    {"cuGraphAddKernelNode",                  12000, Fn(cuGraphAddKernelNode_v2),                 nullptr},
    {"cuGraphAddMemFreeNode",                 11040, Fn(cuGraphAddMemFreeNode),                   nullptr},
    {"cuGraphClone",                          10000, Fn(cuGraphClone),                            nullptr},
    {"cuGraphGetNodes",                       10000, Fn(cuGraphGetNodes),                         nullptr},
    // created contexts (user_contexts.cpp)
    {"cuCtxCreate",                           12050, Fn(cuCtxCreate_v4),                          nullptr},
    {"cuCtxDestroy",                           4000, Fn(cuCtxDestroy_v2),                         nullptr},
    // modules and kernels (modules.cpp)
    {"cuModuleLoadData",                       2000, Fn(cuModuleLoadData),                        nullptr},
    {"cuModuleLoadDataEx",                     2010, Fn(cuModuleLoadDataEx),                      nullptr},
    {"cuModuleLoadFatBinary",                  2000, Fn(cuModuleLoadFatBinary),                   nullptr},
    {"cuModuleUnload",                         2000, Fn(cuModuleUnload),                          nullptr},
    {"cuModuleGetFunction",                    2000, Fn(cuModuleGetFunction),                     nullptr},
    {"cuFuncGetAttribute",                     2020, Fn(cuFuncGetAttribute),                      nullptr},
    {"cuLaunchKernel",                         4000, Fn(cuLaunchKernel),                          Fn(cuLaunchKernel_ptsz)},
    {"fakecuSetKernelStandIn",                13000, Fn(fakecuSetKernelStandIn),                  nullptr},
    {"fakecuLaunchDelayedFill",               13000, Fn(fakecuLaunchDelayedFill),                 Fn(fakecuLaunchDelayedFill_ptsz)},
};
// clang-format on

CUresult Lookup(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  auto report = [&](CUdriverProcAddressQueryResult st) {
    if (status != nullptr) *status = st;
  };
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t kValidFlags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kValidFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // cuda.h: "If the specified CUDA version is greater than the driver version, the API will return
  // CUDA_ERROR_INVALID_VALUE" (a library built for a newer CUDA than the driver must be told).
  if (cudaVersion > kDriverVersion) return CUDA_ERROR_INVALID_VALUE;
  {
    State& s = GetState();
    std::lock_guard lk(s.mu);
    ++s.proc_queries[{std::string(symbol), cudaVersion, static_cast<unsigned long long>(flags)}];
  }
  *pfn = nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const ProcEntry* best = nullptr;
  bool name_known = false;
  for (const ProcEntry& e : kProcTable) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    name_known = true;
    if (e.version <= cudaVersion && (best == nullptr || e.version > best->version)) best = &e;
  }
  if (best == nullptr) {
    report(name_known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = (per_thread && best->per_thread != nullptr) ? best->per_thread : best->legacy;
  report(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

// CUDA 11.3 form (4 arguments).
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return Lookup(symbol, pfn, cudaVersion, flags, nullptr);
}

// CUDA 12.0+ form; what libcudart.so.13 dlsym()s.
CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  return Lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

// cuGetExportTable (the runtime's private channel into the driver) lives in export_tables.cpp.
