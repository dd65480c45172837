// Kernels: what nvcc's generated host code calls (__cudaRegisterFatBinary(End), __cudaRegisterFunction,
// __cudaPush/PopCallConfiguration, __cudaGetKernel, __cudaLaunchKernel(_ptsz)), the public launch and
// function-query calls, and the stand-in hook.
//
// Like NVIDIA's runtime, registration only records the fatbin and the host-stub -> kernel-name
// mapping; the module is loaded into the driver (cuModuleLoadData) on first use, and every launch is
// a cuLaunchKernel, so a shim or a test sees kernels exactly as the driver API delivers them.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime.h"

using namespace fakecudart;

namespace {

struct FatBinary {
  void* wrapper = nullptr;  // nvcc's __fatBinC_Wrapper_t; cuModuleLoadData understands it
  CUmodule module = nullptr;      // loaded on first use
};

struct Kernel {
  FatBinary* binary = nullptr;
  std::string name;
  CUfunction function = nullptr;  // resolved on first use
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<FatBinary>> binaries;
  std::unordered_map<const void*, std::unique_ptr<Kernel>> by_host_stub;
};

Registry& Kernels() {
  static auto* r = new Registry;  // never destroyed: atexit unregistration may run after statics die
  return *r;
}

Kernel* FindKernel(const void* host_stub) {
  std::lock_guard lk(Kernels().mu);
  auto it = Kernels().by_host_stub.find(host_stub);
  return it == Kernels().by_host_stub.end() ? nullptr : it->second.get();
}

bool IsKernel(const Kernel* k) {
  std::lock_guard lk(Kernels().mu);
  for (auto& [stub, kernel] : Kernels().by_host_stub) {
    if (kernel.get() == k) return true;
  }
  return false;
}

// Loads the kernel's module and finds the function, once.
cudaError_t Resolve(Kernel* k, CUfunction* out) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return e;
  std::lock_guard lk(Kernels().mu);
  if (k->function == nullptr) {
    if (k->binary->module == nullptr) {
      if (CUresult r = Driver().cuModuleLoadData(&k->binary->module, k->binary->wrapper); r != CUDA_SUCCESS) {
        return r == CUDA_ERROR_INVALID_IMAGE ? cudaErrorInvalidKernelImage : Translate(r);
      }
    }
    if (CUresult r = Driver().cuModuleGetFunction(&k->function, k->binary->module, k->name.c_str());
        r != CUDA_SUCCESS) {
      return r == CUDA_ERROR_NOT_FOUND ? cudaErrorInvalidDeviceFunction : Translate(r);
    }
  }
  *out = k->function;
  return cudaSuccess;
}

cudaError_t Launch(Kernel* k, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream, bool ptsz) {
  if (k == nullptr) return Record(cudaErrorInvalidDeviceFunction);
  CUfunction f = nullptr;
  if (cudaError_t e = Resolve(k, &f); e != cudaSuccess) return Record(e);
  if (shared > 0xffffffffu) return Record(cudaErrorInvalidConfiguration);
  auto launch = ptsz ? Driver().cuLaunchKernel_ptsz : Driver().cuLaunchKernel;
  CUresult r = launch(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<unsigned>(shared),
                      reinterpret_cast<CUstream>(stream), args, nullptr);
  // A launch configuration the device cannot run is cudaErrorInvalidConfiguration in the runtime.
  return Record(r == CUDA_ERROR_INVALID_VALUE ? cudaErrorInvalidConfiguration : Translate(r));
}

struct CallConfiguration {
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
};
thread_local std::vector<CallConfiguration> t_call_configurations;

}  // namespace

extern "C" {

void** CUDARTAPI __cudaRegisterFatBinary(void* fatCubin) {
  auto binary = std::make_unique<FatBinary>();
  binary->wrapper = fatCubin;
  std::lock_guard lk(Kernels().mu);
  Kernels().binaries.push_back(std::move(binary));
  // The handle the program passes back: a pointer to our record's slot.
  return reinterpret_cast<void**>(&Kernels().binaries.back()->wrapper);
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void** fatCubinHandle) { (void)fatCubinHandle; }

void CUDARTAPI __cudaUnregisterFatBinary(void** fatCubinHandle) {
  // Runs from atexit. The driver drops modules with the process; unloading here could race with
  // other threads' launches during exit, so the registration simply stays.
  (void)fatCubinHandle;
}

char CUDARTAPI __cudaInitModule(void** fatCubinHandle) { return fatCubinHandle != nullptr ? 1 : 0; }

void CUDARTAPI __cudaRegisterFunction(void** fatCubinHandle, const char* hostFun, char* deviceFun,
                                      const char* deviceName, int thread_limit, uint3* tid, uint3* bid,
                                      dim3* bDim, dim3* gDim, int* wSize) {
  (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
  if (fatCubinHandle == nullptr || hostFun == nullptr || deviceName == nullptr) return;
  auto k = std::make_unique<Kernel>();
  // The handle points at FatBinary::wrapper, its first member.
  k->binary = reinterpret_cast<FatBinary*>(fatCubinHandle);
  k->name = deviceName;
  std::lock_guard lk(Kernels().mu);
  Kernels().by_host_stub[hostFun] = std::move(k);
}

unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, struct CUstream_st* stream) {
  t_call_configurations.push_back({gridDim, blockDim, sharedMem, stream});
  return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem, void* stream) {
  if (t_call_configurations.empty()) return cudaErrorMissingConfiguration;
  CallConfiguration c = t_call_configurations.back();
  t_call_configurations.pop_back();
  *gridDim = c.grid;
  *blockDim = c.block;
  *sharedMem = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t* kernel, const void* hostFun) {
  if (kernel == nullptr) return Record(cudaErrorInvalidValue);
  Kernel* k = FindKernel(hostFun);
  if (k == nullptr) return Record(cudaErrorInvalidDeviceFunction);
  *kernel = reinterpret_cast<cudaKernel_t>(k);
  return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                         size_t sharedMem, cudaStream_t stream) {
  Kernel* k = reinterpret_cast<Kernel*>(kernel);
  return Launch(IsKernel(k) ? k : nullptr, gridDim, blockDim, args, sharedMem, stream, false);
}

cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                              size_t sharedMem, cudaStream_t stream) {
  Kernel* k = reinterpret_cast<Kernel*>(kernel);
  return Launch(IsKernel(k) ? k : nullptr, gridDim, blockDim, args, sharedMem, stream, true);
}

}  // extern "C"

cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                                       cudaStream_t stream) {
  return Launch(FindKernel(func), gridDim, blockDim, args, sharedMem, stream, false);
}

cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                            size_t sharedMem, cudaStream_t stream) {
  return Launch(FindKernel(func), gridDim, blockDim, args, sharedMem, stream, true);
}

cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr) return Record(cudaErrorInvalidValue);
  Kernel* k = FindKernel(func);
  if (k == nullptr) return Record(cudaErrorInvalidDeviceFunction);
  CUfunction f = nullptr;
  if (cudaError_t e = Resolve(k, &f); e != cudaSuccess) return Record(e);
  std::memset(attr, 0, sizeof(*attr));
  struct {
    CUfunction_attribute what;
    int* into;
  } fields[] = {
      {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &attr->maxThreadsPerBlock},
      {CU_FUNC_ATTRIBUTE_NUM_REGS, &attr->numRegs},
      {CU_FUNC_ATTRIBUTE_PTX_VERSION, &attr->ptxVersion},
      {CU_FUNC_ATTRIBUTE_BINARY_VERSION, &attr->binaryVersion},
      {CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, &attr->cacheModeCA},
      {CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &attr->maxDynamicSharedSizeBytes},
      {CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, &attr->preferredShmemCarveout},
  };
  for (auto& field : fields) {
    if (CUresult r = Driver().cuFuncGetAttribute(field.into, field.what, f); r != CUDA_SUCCESS) {
      return Record(Translate(r));
    }
  }
  int bytes = 0;
  for (auto [what, into] : {std::pair{CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &attr->sharedSizeBytes},
                            std::pair{CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, &attr->constSizeBytes},
                            std::pair{CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &attr->localSizeBytes}}) {
    if (CUresult r = Driver().cuFuncGetAttribute(&bytes, what, f); r != CUDA_SUCCESS) return Record(Translate(r));
    *into = static_cast<size_t>(bytes);
  }
  return cudaSuccess;
}

// Occupancy from the H100 limits the simulated device reports and the kernel's attributes: blocks
// per SM bounded by threads (2048), blocks (32), registers (65536) and shared memory (228 KiB).
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, const void* func,
                                                                             int blockSize, size_t dynamicSMemSize,
                                                                             unsigned int flags) {
  if (numBlocks == nullptr || blockSize <= 0) return Record(cudaErrorInvalidValue);
  if (flags != cudaOccupancyDefault && flags != cudaOccupancyDisableCachingOverride) {
    return Record(cudaErrorInvalidValue);
  }
  cudaFuncAttributes attr;
  if (cudaError_t e = cudaFuncGetAttributes(&attr, func); e != cudaSuccess) return e;
  if (blockSize > attr.maxThreadsPerBlock) {
    *numBlocks = 0;
    return cudaSuccess;
  }
  if (dynamicSMemSize > static_cast<size_t>(attr.maxDynamicSharedSizeBytes)) return Record(cudaErrorInvalidValue);
  const int warps = (blockSize + 31) / 32;
  int blocks = std::min(32, 2048 / (warps * 32));
  const int regs_per_block = std::max(attr.numRegs, 1) * warps * 32;
  blocks = std::min(blocks, 65536 / regs_per_block);
  const size_t smem = attr.sharedSizeBytes + dynamicSMemSize;
  if (smem > 0) blocks = std::min<int>(blocks, static_cast<int>((228 * 1024) / (smem + 1024)));
  *numBlocks = blocks;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, const void* func, int blockSize,
                                                                    size_t dynamicSMemSize) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize,
                                                                cudaOccupancyDefault);
}

int fakecudaSetKernelStandIn(const char* name, fakecudaKernelStandIn fn, void* user, const size_t* arg_sizes,
                             int num_args) {
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return Record(e);
  if (Driver().fakecuSetKernelStandIn == nullptr) return Record(cudaErrorNotSupported);
  return Record(Translate(Driver().fakecuSetKernelStandIn(name, fn, user, arg_sizes, num_args)));
}

cudaError_t CUDARTAPI cudaGraphAddKernelNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                             const cudaGraphNode_t* pDependencies, size_t numDependencies,
                                             const struct cudaKernelNodeParams* pNodeParams) {
  if (pNodeParams == nullptr) return Record(cudaErrorInvalidValue);
  Kernel* k = FindKernel(pNodeParams->func);
  if (k == nullptr) return Record(cudaErrorInvalidDeviceFunction);
  CUfunction f = nullptr;
  if (cudaError_t e = Resolve(k, &f); e != cudaSuccess) return Record(e);
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = f;
  p.gridDimX = pNodeParams->gridDim.x;
  p.gridDimY = pNodeParams->gridDim.y;
  p.gridDimZ = pNodeParams->gridDim.z;
  p.blockDimX = pNodeParams->blockDim.x;
  p.blockDimY = pNodeParams->blockDim.y;
  p.blockDimZ = pNodeParams->blockDim.z;
  p.sharedMemBytes = pNodeParams->sharedMemBytes;
  p.kernelParams = pNodeParams->kernelParams;
  p.extra = pNodeParams->extra;
  CUresult r = Driver().cuGraphAddKernelNode_v2(reinterpret_cast<CUgraphNode*>(pGraphNode), reinterpret_cast<CUgraph>(graph),
                                                reinterpret_cast<const CUgraphNode*>(pDependencies), numDependencies, &p);
  return Record(Translate(r));
}
