// What real clients need beyond allocation (issue 18): export tables, modules and kernel launches
// with stand-ins, kernel registration by nvcc-generated code, host registration, stream callbacks,
// peer access, device flags, the profiler calls, and H100 launch limits.
#include <chrono>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <cudaProfiler.h>
#include <cuda_profiler_api.h>

#include "test_util.h"

// What nvcc's generated host code declares (crt/host_runtime.h), for the registration test.
extern "C" {
void** __cudaRegisterFatBinary(void* fatCubin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaRegisterFunction(void** handle, const char* hostFun, char* deviceFun, const char* deviceName,
                            int thread_limit, uint3* tid, uint3* bid, dim3* bDim, dim3* gDim, int* wSize);
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem, void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                               cudaStream_t stream);
}

namespace fakecuda_test {
namespace {

// A PTX module with two kernels, as numba or NVRTC would hand to cuModuleLoadData.
const char kPtx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry fill_u32(.param .u64 out, .param .u32 value, .param .u32 n) { ret; }\n"
    ".visible .entry noop() { ret; }\n";

struct FillArgs {
  static void Run(void** args, const fakecudaLaunchDims* dims, void* user) {
    auto* out = *static_cast<unsigned**>(args[0]);
    const unsigned value = *static_cast<unsigned*>(args[1]);
    const unsigned n = *static_cast<unsigned*>(args[2]);
    if (user != nullptr) usleep(*static_cast<unsigned*>(user));
    for (unsigned i = 0; i < n; ++i) out[i] = value + i;
    EXPECT_GE(dims->grid[0] * dims->block[0], n);
  }
};
const size_t kFillArgSizes[] = {sizeof(void*), sizeof(unsigned), sizeof(unsigned)};

class Kernels : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    ASSERT_CU(cuModuleLoadData(&module_, kPtx));
    ASSERT_CU(cuModuleGetFunction(&fill_, module_, "fill_u32"));
  }
  void TearDown() override {
    fakecuSetKernelStandIn("fill_u32", nullptr, nullptr, nullptr, 0);
    DriverTest::TearDown();
  }
  CUmodule module_ = nullptr;
  CUfunction fill_ = nullptr;
};

TEST_F(Kernels, ModuleFindsOnlyItsKernels) {
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, module_, "noop"));
  EXPECT_EQ(cuModuleGetFunction(&f, module_, "fill"), CUDA_ERROR_NOT_FOUND);  // a prefix is not a kernel
  EXPECT_EQ(cuModuleGetFunction(&f, module_, "missing"), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuModuleGetFunction(&f, module_, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUmodule bad = nullptr;
  EXPECT_EQ(cuModuleLoadData(&bad, "not an image"), CUDA_ERROR_INVALID_IMAGE);
  CUmodule other = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&other, kPtx, 0, nullptr, nullptr));
  ASSERT_CU(cuModuleUnload(other));
  EXPECT_EQ(cuModuleUnload(other), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuModuleGetFunction(&f, other, "noop"), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(Kernels, LaunchWithoutStandInIsAStreamOrderedNoOp) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  ASSERT_CU(cuMemsetD8(d, 0x5a, 4096));
  unsigned value = 1, n = 1024;
  void* args[] = {&d, &value, &n};
  ASSERT_CU(cuLaunchKernel(fill_, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(reinterpret_cast<unsigned char*>(d)[100], 0x5a);
  ASSERT_CU(cuMemFree(d));
}

// Kernels take time (FAKECUDA_KERNEL_US, 20 us by default): the host runs ahead of its stream,
// and an event recorded after a run of launches completes only once they all have run.
TEST_F(Kernels, LaunchesKeepTheirStreamBusy) {
  CUstream st = nullptr;
  ASSERT_CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUevent done = nullptr;
  ASSERT_CU(cuEventCreate(&done, CU_EVENT_DEFAULT));
  void* none[] = {nullptr};
  constexpr int kLaunches = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLaunches; ++i) ASSERT_CU(cuLaunchKernel(fill_, 1, 1, 1, 1, 1, 1, 0, st, none, nullptr));
  ASSERT_CU(cuEventRecord(done, st));
  const CUresult early = cuEventQuery(done);
  const auto queried = std::chrono::steady_clock::now();
  const auto work = std::chrono::microseconds(kLaunches * 20);
  // Only a host slower than the device's work could see it done already.
  if (queried - start < work) {
    EXPECT_EQ(early, CUDA_ERROR_NOT_READY);
  }
  ASSERT_CU(cuEventSynchronize(done));
  EXPECT_GE(std::chrono::steady_clock::now() - start, work);
  ASSERT_CU(cuEventDestroy(done));
  ASSERT_CU(cuStreamDestroy(st));
}

TEST_F(Kernels, LaunchConfigurationIsValidatedLikeCuda) {
  void* none[] = {nullptr};
  EXPECT_EQ(cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, none, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(fill_, 1, 1, 1, 2048, 1, 1, 0, nullptr, none, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(fill_, 1, 1, 1, 32, 32, 2, 0, nullptr, none, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(fill_, 1, 1, 1, 1, 1, 65, 0, nullptr, none, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(fill_, 0, 1, 1, 1, 1, 1, 0, nullptr, none, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(fill_, 1, 65536, 1, 1, 1, 1, 0, nullptr, none, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(fill_, 1, 1, 1, 1, 1, 1, 64 << 10, nullptr, none, nullptr), CUDA_ERROR_INVALID_VALUE);
  void* extra[] = {CU_LAUNCH_PARAM_END};
  EXPECT_EQ(cuLaunchKernel(fill_, 1, 1, 1, 1, 1, 1, 0, nullptr, none, extra), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cuLaunchKernel(fill_, 2147483647u, 65535, 1, 1024, 1, 1, 48 << 10, nullptr, none, nullptr));
}

TEST_F(Kernels, StandInRunsInStreamOrderWithArgumentsCopiedAtLaunch) {
  unsigned delay_us = 20000;
  ASSERT_CU(fakecuSetKernelStandIn("fill_u32", FillArgs::Run, &delay_us, kFillArgSizes, 3));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 1024 * sizeof(unsigned)));
  std::vector<unsigned> host(1024, 0);
  {
    unsigned value = 100, n = 1024;
    void* args[] = {&d, &value, &n};
    ASSERT_CU(cuLaunchKernel(fill_, 4, 1, 1, 256, 1, 1, 0, s, args, nullptr));
    value = 0;  // arguments are passed by value: changing them now changes nothing
  }
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);  // the "kernel" is still running
  ASSERT_CU(cuMemcpyDtoHAsync(host.data(), d, host.size() * sizeof(unsigned), s));
  ASSERT_CU(cuStreamSynchronize(s));
  for (unsigned i = 0; i < 1024; ++i) ASSERT_EQ(host[i], 100 + i) << i;
  ASSERT_CU(cuMemFree(d));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Kernels, CapturedLaunchRunsOnEveryGraphLaunch) {
  ASSERT_CU(fakecuSetKernelStandIn("fill_u32", FillArgs::Run, nullptr, kFillArgSizes, 3));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 64 * sizeof(unsigned)));
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  unsigned value = 7, n = 64;
  void* args[] = {&d, &value, &n};
  ASSERT_CU(cuLaunchKernel(fill_, 1, 1, 1, 64, 1, 1, 0, s, args, nullptr));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s, &graph));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_NE(reinterpret_cast<unsigned*>(d)[3], 10u);  // captured, not run
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    ASSERT_CU(cuMemsetD8(d, 0, 64 * sizeof(unsigned)));
    ASSERT_CU(cuGraphLaunch(exec, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(reinterpret_cast<unsigned*>(d)[3], 10u) << round;
  }
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuMemFree(d));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Kernels, FunctionAttributes) {
  int v = 0;
  ASSERT_CU(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fill_));
  EXPECT_EQ(v, 1024);
  ASSERT_CU(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, fill_));
  EXPECT_GT(v, 0);
  EXPECT_EQ(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuFuncGetAttribute(nullptr, CU_FUNC_ATTRIBUTE_NUM_REGS, fill_), CUDA_ERROR_INVALID_VALUE);
}

// ---- the runtime's side: what nvcc-generated host code calls ----
// A host "stub" whose address registers the kernel, as nvcc's generated stubs do.
void fill_u32_stub() {}

class Registration : public RuntimeTest {};

TEST_F(Registration, RegisteredKernelLaunchesThroughTheDriver) {
  // nvcc's wrapper: magic, version, pointer to the image (here PTX), unused.
  static struct {
    int magic;
    int version;
    const void* data;
    void* unused;
  } wrapper = {0x466243b1, 1, kPtx, nullptr};
  void** handle = __cudaRegisterFatBinary(&wrapper);
  ASSERT_NE(handle, nullptr);
  __cudaRegisterFunction(handle, reinterpret_cast<const char*>(&fill_u32_stub), nullptr, "fill_u32", -1, nullptr,
                         nullptr, nullptr, nullptr, nullptr);
  __cudaRegisterFatBinaryEnd(handle);
  ASSERT_EQ(fakecudaSetKernelStandIn("fill_u32", FillArgs::Run, nullptr, kFillArgSizes, 3), cudaSuccess);

  unsigned* d = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&d), 256 * sizeof(unsigned)));
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  // <<<grid, block, shared, stream>>> as nvcc lowers it.
  ASSERT_EQ(__cudaPushCallConfiguration(dim3(1), dim3(256), 0, s), 0u);
  dim3 grid, block;
  size_t shared = 1;
  cudaStream_t popped = nullptr;
  ASSERT_RT(__cudaPopCallConfiguration(&grid, &block, &shared, &popped));
  EXPECT_EQ(block.x, 256u);
  EXPECT_EQ(shared, 0u);
  EXPECT_EQ(popped, s);
  EXPECT_EQ(__cudaPopCallConfiguration(&grid, &block, &shared, &popped), cudaErrorMissingConfiguration);
  cudaKernel_t kernel = nullptr;
  ASSERT_RT(__cudaGetKernel(&kernel, reinterpret_cast<const void*>(&fill_u32_stub)));
  unsigned value = 5, n = 256;
  void* args[] = {&d, &value, &n};
  ASSERT_RT(__cudaLaunchKernel(kernel, grid, block, args, shared, popped));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(d[255], 260u);
  // The public form, by host stub.
  value = 9;
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_u32_stub), dim3(1), dim3(256), args, 0, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(d[0], 9u);
  EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_u32_stub), dim3(1), dim3(2048), args, 0, s),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&Seconds), dim3(1), dim3(1), args, 0, s),
            cudaErrorInvalidDeviceFunction);
  cudaGetLastError();

  cudaFuncAttributes attr{};
  ASSERT_RT(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&fill_u32_stub)));
  EXPECT_EQ(attr.maxThreadsPerBlock, 1024);
  int blocks = 0;
  ASSERT_RT(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(&fill_u32_stub),
                                                          256, 0));
  EXPECT_EQ(blocks, 8);  // 2048 threads per SM / 256
  ASSERT_RT(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(&fill_u32_stub),
                                                          32, 0));
  EXPECT_EQ(blocks, 32);  // the per-SM block limit
  EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(&Seconds), 32, 0),
            cudaErrorInvalidDeviceFunction);
  cudaGetLastError();
  fakecudaSetKernelStandIn("fill_u32", nullptr, nullptr, nullptr, 0);
  ASSERT_RT(cudaStreamDestroy(s));
  ASSERT_RT(cudaFree(d));
}

// ---- explicit graphs ----
void graph_fill_stub() {}

class ExplicitGraphs : public RuntimeTest {};

TEST_F(ExplicitGraphs, NodesRunInOrderOnEveryLaunchAndGraphMemoryGoesWithTheGraph) {
  static struct {
    int magic;
    int version;
    const void* data;
    void* unused;
  } wrapper = {0x466243b1, 1, kPtx, nullptr};
  void** handle = __cudaRegisterFatBinary(&wrapper);
  __cudaRegisterFunction(handle, reinterpret_cast<const char*>(&graph_fill_stub), nullptr, "fill_u32", -1, nullptr,
                         nullptr, nullptr, nullptr, nullptr);
  ASSERT_EQ(fakecudaSetKernelStandIn("fill_u32", FillArgs::Run, nullptr, kFillArgSizes, 3), cudaSuccess);
  const size_t used_before = fakecudaDeviceUsedBytes(0);

  cudaGraph_t graph = nullptr;
  ASSERT_RT(cudaGraphCreate(&graph, 0));
  cudaMemAllocNodeParams alloc{};
  alloc.poolProps.allocType = cudaMemAllocationTypePinned;
  alloc.poolProps.location.type = cudaMemLocationTypeDevice;
  alloc.poolProps.location.id = 0;
  alloc.bytesize = 64 * sizeof(unsigned);
  cudaGraphNode_t n_alloc, n_memset, n_kernel, n_copy, n_host, n_free;
  ASSERT_RT(cudaGraphAddMemAllocNode(&n_alloc, graph, nullptr, 0, &alloc));
  ASSERT_NE(alloc.dptr, nullptr);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used_before + 512);
  cudaMemsetParams memset{};
  memset.dst = alloc.dptr;
  memset.value = 0xff;
  memset.elementSize = 1;
  memset.width = alloc.bytesize;
  memset.height = 1;
  ASSERT_RT(cudaGraphAddMemsetNode(&n_memset, graph, &n_alloc, 1, &memset));
  unsigned* d = static_cast<unsigned*>(alloc.dptr);
  unsigned value = 40, n = 32;  // the kernel overwrites the first half only
  void* args[] = {&d, &value, &n};
  cudaKernelNodeParams kernel{};
  kernel.func = reinterpret_cast<void*>(&graph_fill_stub);
  kernel.gridDim = dim3(1);
  kernel.blockDim = dim3(32);
  kernel.kernelParams = args;
  ASSERT_RT(cudaGraphAddKernelNode(&n_kernel, graph, &n_memset, 1, &kernel));
  value = 0;  // captured at add time
  std::vector<unsigned> host(64, 0);
  ASSERT_RT(cudaGraphAddMemcpyNode1D(&n_copy, graph, &n_kernel, 1, host.data(), d, 64 * sizeof(unsigned),
                                     cudaMemcpyDeviceToHost));
  static std::atomic<int> runs{0};
  cudaHostNodeParams host_fn{[](void*) { ++runs; }, nullptr};
  ASSERT_RT(cudaGraphAddHostNode(&n_host, graph, &n_copy, 1, &host_fn));
  ASSERT_RT(cudaGraphAddMemFreeNode(&n_free, graph, &n_host, 1, alloc.dptr));
  EXPECT_EQ(cudaGraphAddMemFreeNode(&n_free, graph, &n_host, 1, alloc.dptr), cudaErrorInvalidValue);  // twice
  cudaGetLastError();

  size_t count = 0;
  ASSERT_RT(cudaGraphGetNodes(graph, nullptr, &count));
  EXPECT_EQ(count, 6u);
  std::vector<cudaGraphNode_t> nodes(count);
  ASSERT_RT(cudaGraphGetNodes(graph, nodes.data(), &count));
  EXPECT_EQ(nodes.front(), n_alloc);
  EXPECT_EQ(nodes.back(), n_free);

  // A node of another graph is no dependency.
  cudaGraph_t other = nullptr;
  ASSERT_RT(cudaGraphCreate(&other, 0));
  cudaGraphNode_t empty;
  EXPECT_EQ(cudaGraphAddEmptyNode(&empty, other, &n_alloc, 1), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_RT(cudaGraphAddEmptyNode(&empty, other, nullptr, 0));
  ASSERT_RT(cudaGraphAddHostNode(&n_host, other, &empty, 1, &host_fn));
  // A graph that owns graph memory is not cloned; one without is.
  cudaGraph_t clone = nullptr;
  EXPECT_EQ(cudaGraphClone(&clone, graph), cudaErrorNotSupported);
  cudaGetLastError();
  ASSERT_RT(cudaGraphClone(&clone, other));
  ASSERT_RT(cudaGraphGetNodes(clone, nullptr, &count));
  EXPECT_EQ(count, 2u);

  cudaGraphExec_t exec = nullptr, clone_exec = nullptr;
  ASSERT_RT(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_RT(cudaGraphInstantiate(&clone_exec, clone, 0));
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  for (int launch = 1; launch <= 2; ++launch) {
    std::fill(host.begin(), host.end(), 0u);
    ASSERT_RT(cudaGraphLaunch(exec, s));
    ASSERT_RT(cudaStreamSynchronize(s));
    EXPECT_EQ(host[0], 40u);
    EXPECT_EQ(host[31], 71u);
    EXPECT_EQ(host[32], 0xffffffffu);
    EXPECT_EQ(runs.load(), launch);
  }
  ASSERT_RT(cudaGraphLaunch(clone_exec, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(runs.load(), 3);
  ASSERT_RT(cudaGraphExecDestroy(clone_exec));
  ASSERT_RT(cudaGraphExecDestroy(exec));
  ASSERT_RT(cudaGraphDestroy(clone));
  ASSERT_RT(cudaGraphDestroy(other));
  ASSERT_RT(cudaGraphDestroy(graph));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used_before);  // freed inside the graph: released with it
  fakecudaSetKernelStandIn("fill_u32", nullptr, nullptr, nullptr, 0);
  ASSERT_RT(cudaStreamDestroy(s));
}

// ---- created contexts ----
class CreatedContexts : public DriverTest {};

TEST_F(CreatedContexts, CreateMakesCurrentAndDestroyFreesEverythingItOwns) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxCreate(&ctx, nullptr, CU_CTX_SCHED_BLOCKING_SYNC, 0));
  ASSERT_NE(ctx, ctx_);
  CUcontext current = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, ctx);
  CUdevice dev = -1;
  ASSERT_CU(cuCtxGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 1 << 20));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemsetD8Async(d, 1, 1 << 20, s));
  CUcontext owner = nullptr;
  ASSERT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d));
  EXPECT_EQ(owner, ctx);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + (1 << 20));
  // Another thread makes it current before it is destroyed.
  std::atomic<int> stage{0};
  CUresult seen = CUDA_SUCCESS;
  std::thread other([&] {
    cuCtxSetCurrent(ctx);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    CUdeviceptr p = 0;
    seen = cuMemAlloc(&p, 512);
  });
  while (stage.load() != 1) std::this_thread::yield();
  ASSERT_CU(cuCtxDestroy(ctx));
  stage = 2;
  other.join();
  EXPECT_EQ(seen, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);  // its memory went with it
  ASSERT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, ctx_);  // popped off this thread's stack
  EXPECT_EQ(cuCtxDestroy(ctx_), CUDA_ERROR_INVALID_CONTEXT);  // primary contexts are reset, not destroyed
  EXPECT_DEATH(cuCtxDestroy(ctx), "fakecuda: misuse: cuCtxDestroy_v2: context 0x[0-9a-f]+ was destroyed \\(cuCtxDestroy_v2\\)");
}

TEST_F(CreatedContexts, DestroyLeavesStreamOrderedMemoryToItsPool) {
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr plain = 0, ordered = 0;
  ASSERT_CU(cuMemAlloc(&plain, 1 << 20));
  ASSERT_CU(cuMemAllocAsync(&ordered, 1 << 20, s));
  ASSERT_CU(cuStreamSynchronize(s));
  const size_t used = fakecudaDeviceUsedBytes(0);
  ASSERT_CU(cuCtxDestroy(ctx));
  // CUDA: "cuCtxDestroy() will not destroy memory allocations by cuMemCreate(), cuMemAllocAsync()
  // and cuMemAllocFromPoolAsync()"; everything else of the context goes.
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used - (1 << 20));
  CUcontext owner = nullptr;
  EXPECT_NE(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, plain), CUDA_SUCCESS);
  ASSERT_CU(cuMemsetD8(ordered, 7, 1 << 20));  // still the program's memory
  ASSERT_CU(cuMemFreeAsync(ordered, nullptr));
  ASSERT_CU(cuCtxSynchronize());
}

// cuMemFree and cuMemFreeHost wait for the device's work, and a created context's streams are the
// device's too: the free waited for the primary context only, and a fill still queued on the created
// context's stream wrote into the next owner of the address (a pinned buffer freed so crashed).
TEST_F(CreatedContexts, FreesWaitForTheCreatedContextsStreams) {
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr size_t kBytes = 1 << 20;
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, kBytes));
  ASSERT_CU(fakecuLaunchDelayedFill(p, 0x33, kBytes, 100000, s));
  ASSERT_CU(cuMemFree(p));
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);  // the fill ran before the free returned
  CUdeviceptr q = 0;
  ASSERT_CU(cuMemAlloc(&q, kBytes));
  ASSERT_CU(cuMemsetD8(q, 0x44, kBytes));
  ASSERT_CU(cuStreamSynchronize(s));
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, q, 1));
  EXPECT_EQ(b, 0x44);
  ASSERT_CU(cuMemFree(q));

  void* pinned = nullptr;
  ASSERT_CU(cuMemAllocHost(&pinned, kBytes));
  CUdeviceptr src = 0;
  ASSERT_CU(cuMemAlloc(&src, kBytes));
  ASSERT_CU(fakecuLaunchDelayedFill(src, 0x55, kBytes, 100000, s));
  ASSERT_CU(cuMemcpyDtoHAsync(pinned, src, kBytes, s));  // behind the fill
  ASSERT_CU(cuMemFreeHost(pinned));
  EXPECT_EQ(cuStreamQuery(s), CUDA_SUCCESS);
  ASSERT_CU(cuMemFree(src));
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuCtxDestroy(ctx));
}

// A query of memory a cuMemFree on another thread is freeing right now answers as freed (invalid
// value), as a moment later: only cuMemFreeAsync makes a query undefined. The shim's context walk
// queries every allocation it knows of, and one being freed meanwhile stopped the process.
TEST_F(CreatedContexts, AQueryDuringAnotherThreadsFreeAnswersFreed) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 1 << 20));
  ASSERT_CU(fakecuLaunchDelayedFill(p, 1, 1 << 20, 200000, s));  // the free waits for it
  CUcontext ctx = ctx_;
  std::thread freeing([&] {
    cuCtxSetCurrent(ctx);
    cuMemFree(p);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // inside the free's wait
  CUcontext owner = nullptr;
  const CUresult during = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p);
  freeing.join();
  EXPECT_EQ(during, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuStreamDestroy(s));
}

// "CUDA Runtime API calls operate on the CUDA Driver API CUcontext which is current to the calling
// host thread": the simulated runtime bound the primary context over it at a thread's first call.
TEST_F(CreatedContexts, TheRuntimeUsesTheContextCurrentToTheThread) {
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  CUcontext owner = nullptr, current = nullptr;
  std::thread([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx));
    void* p = nullptr;
    ASSERT_RT(cudaMalloc(&p, 4096));  // the thread's first runtime call
    ASSERT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(p)));
    ASSERT_CU(cuCtxGetCurrent(&current));
    ASSERT_RT(cudaFree(p));
  }).join();
  EXPECT_EQ(owner, ctx);
  EXPECT_EQ(current, ctx);
  // A thread with no context gets the primary one, as before.
  std::thread([&] {
    void* p = nullptr;
    ASSERT_RT(cudaMalloc(&p, 4096));
    ASSERT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(p)));
    ASSERT_RT(cudaFree(p));
  }).join();
  EXPECT_EQ(owner, ctx_);
  ASSERT_CU(cuCtxDestroy(ctx));
}

// A thread whose first runtime call comes under a context destroyed since (it stays current there)
// got the primary context bound over it, and memory, where CUDA's runtime refuses it as it does
// every later call: "invalid device context" (cudaErrorDeviceUninitialized) on an H200
// (2026-11-29), whose driver still names the context's device (cuCtxGetDevice).
TEST_F(CreatedContexts, AThreadsFirstRuntimeCallUnderADestroyedContextIsRefused) {
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  std::atomic<int> stage{0};
  cudaError_t first = cudaSuccess, last = cudaSuccess, again = cudaSuccess;
  void* p = nullptr;
  CUcontext current = nullptr;
  CUdevice device = -1;
  CUresult device_there = CUDA_ERROR_UNKNOWN, alloc_there = CUDA_SUCCESS;
  std::thread elsewhere([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx));
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    first = cudaMalloc(&p, 4096);  // the thread's first runtime call
    last = cudaGetLastError();
    again = cudaMalloc(&p, 4096);
    cuCtxGetCurrent(&current);
    device_there = cuCtxGetDevice(&device);
    CUdeviceptr d = 0;
    alloc_there = cuMemAlloc(&d, 4096);
  });
  while (stage.load() != 1) std::this_thread::yield();
  ASSERT_CU(cuCtxDestroy(ctx));
  stage = 2;
  elsewhere.join();
  EXPECT_EQ(first, cudaErrorDeviceUninitialized);
  EXPECT_EQ(last, cudaErrorDeviceUninitialized);
  EXPECT_EQ(again, cudaErrorDeviceUninitialized);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(current, ctx);  // still current there: nothing was bound over it
  EXPECT_EQ(device_there, CUDA_SUCCESS);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(alloc_there, CUDA_ERROR_CONTEXT_IS_DESTROYED);

  // Destroyed by the thread itself while below the top of its stack: current again once popped.
  CUcontext below = nullptr;
  std::thread([&] {
    ASSERT_CU(cuCtxCreate(&below, nullptr, 0, 0));
    ASSERT_CU(cuCtxPushCurrent(ctx_));
    ASSERT_CU(cuCtxDestroy(below));
    ASSERT_CU(cuCtxPopCurrent(nullptr));
    first = cudaMalloc(&p, 4096);
    cuCtxGetCurrent(&current);
  }).join();
  EXPECT_EQ(first, cudaErrorDeviceUninitialized);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(current, below);

  // A primary context the runtime bound, reset since by another thread, is bound again.
  std::thread([&] {
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    std::thread([] { ASSERT_RT(cudaDeviceReset()); }).join();
    first = cudaMalloc(&p, 4096);
  }).join();
  EXPECT_EQ(first, cudaSuccess);
  ASSERT_RT(cudaFree(p));
}

TEST_F(CreatedContexts, ArgumentsAreCheckedLikeCuda) {
  CUcontext ctx = nullptr;
  EXPECT_EQ(cuCtxCreate(&ctx, nullptr, 0, 7), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuCtxCreate(nullptr, nullptr, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxCreate(&ctx, nullptr, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxCreate(&ctx, nullptr, CU_CTX_SCHED_SPIN | CU_CTX_SCHED_YIELD, 0), CUDA_ERROR_INVALID_VALUE);
  CUexecAffinityParam affinity{};
  CUctxCreateParams params{&affinity, 1, nullptr};
  EXPECT_EQ(cuCtxCreate(&ctx, &params, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CUcontext current = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, ctx_);
}

// ---- host registration ----
class HostRegister : public DriverTest {};

TEST_F(HostRegister, RegisteredMemoryIsPinnedAndMapped) {
  std::vector<char> buffer(1 << 16);
  void* p = buffer.data();
  ASSERT_CU(cuMemHostRegister(p, buffer.size(), CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
  unsigned type = 0;
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p)));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  CUdeviceptr dev = 0;
  ASSERT_CU(cuMemHostGetDevicePointer(&dev, buffer.data() + 100, 0));
  EXPECT_EQ(dev, reinterpret_cast<CUdeviceptr>(buffer.data() + 100));
  EXPECT_EQ(cuMemHostRegister(buffer.data() + 10, 10, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);  // not the driver's to free
  EXPECT_EQ(cuMemHostUnregister(buffer.data() + 10), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  ASSERT_CU(cuMemHostUnregister(p));
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cuMemHostGetDevicePointer(&dev, p, 0), CUDA_ERROR_INVALID_VALUE);
  buffer[0] = 1;  // still the caller's memory
  EXPECT_EQ(cuMemHostRegister(nullptr, 10, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(p, 10, 0x40), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(p, 10, CU_MEMHOSTREGISTER_IOMEMORY), CUDA_ERROR_NOT_SUPPORTED);
}

TEST_F(HostRegister, RuntimeFormAndAsyncCopies) {
  std::vector<unsigned> host(1024, 3);
  ASSERT_RT(cudaHostRegister(host.data(), host.size() * sizeof(unsigned), cudaHostRegisterDefault));
  unsigned* d = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(unsigned)));
  ASSERT_RT(cudaMemcpyAsync(d, host.data(), host.size() * sizeof(unsigned), cudaMemcpyHostToDevice, nullptr));
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(d[1023], 3u);
  EXPECT_EQ(cudaHostRegister(host.data(), 4, 0), cudaErrorHostMemoryAlreadyRegistered);
  ASSERT_RT(cudaHostUnregister(host.data()));
  EXPECT_EQ(cudaHostUnregister(host.data()), cudaErrorHostMemoryNotRegistered);
  cudaGetLastError();
  ASSERT_RT(cudaFree(d));
}

// ---- stream callbacks ----
class Callbacks : public DriverTest {};

TEST_F(Callbacks, RunAfterPriorWorkWithTheStream) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 64));
  ASSERT_CU(fakecuLaunchDelayedFill(d, 0x11, 64, 20000, s));
  struct Seen {
    CUstream stream;
    CUresult status;
    unsigned char byte;
  } seen{nullptr, CUDA_ERROR_UNKNOWN, 0};
  static CUdeviceptr target;
  target = d;
  auto cb = [](CUstream stream, CUresult status, void* user) {
    auto* out = static_cast<Seen*>(user);
    out->stream = stream;
    out->status = status;
    out->byte = reinterpret_cast<unsigned char*>(target)[63];
  };
  ASSERT_CU(cuStreamAddCallback(s, cb, &seen, 0));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(seen.stream, s);
  EXPECT_EQ(seen.status, CUDA_SUCCESS);
  EXPECT_EQ(seen.byte, 0x11);
  EXPECT_EQ(cuStreamAddCallback(s, cb, &seen, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamAddCallback(s, nullptr, &seen, 0), CUDA_ERROR_INVALID_VALUE);
  // Not capturable: the capture is invalidated.
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuStreamAddCallback(s, cb, &seen, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_CU(cuMemFree(d));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(Callbacks, RuntimeFormGetsTheRuntimeStatus) {
  std::atomic<int> calls{0};
  auto cb = [](cudaStream_t, cudaError_t status, void* user) {
    EXPECT_EQ(status, cudaSuccess);
    ++*static_cast<std::atomic<int>*>(user);
  };
  ASSERT_RT(cudaStreamAddCallback(nullptr, cb, &calls, 0));
  ASSERT_RT(cudaStreamAddCallback(nullptr, cb, &calls, 0));
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(cudaStreamAddCallback(nullptr, cb, &calls, 2), cudaErrorInvalidValue);
  cudaGetLastError();
}

// ---- peer access, device flags, profiler, limits ----
class DeviceControl : public DriverTest {};

TEST_F(DeviceControl, PeerAccessOfADeviceWithItself) {
  int can = -1;
  ASSERT_CU(cuDeviceCanAccessPeer(&can, 0, 0));
  EXPECT_EQ(can, 0);
  EXPECT_EQ(cuDeviceCanAccessPeer(&can, 0, 64), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx_, 0), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx_, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(5, 0), cudaErrorInvalidDevice);
  cudaGetLastError();
}

TEST_F(DeviceControl, DeviceFlagsRoundTrip) {
  ASSERT_RT(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  unsigned flags = 0;
  ASSERT_RT(cudaGetDeviceFlags(&flags));
  EXPECT_EQ(flags & cudaDeviceScheduleMask, static_cast<unsigned>(cudaDeviceScheduleBlockingSync));
  EXPECT_NE(flags & cudaDeviceMapHost, 0u);
  EXPECT_EQ(cudaSetDeviceFlags(0x1000), cudaErrorInvalidValue);
  EXPECT_EQ(cudaSetDeviceFlags(cudaDeviceScheduleSpin | cudaDeviceScheduleYield), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_RT(cudaSetDeviceFlags(cudaDeviceScheduleAuto));
}

TEST_F(DeviceControl, ProfilerCallsSucceedWithAContext) {
  EXPECT_CU(cuProfilerStart());
  EXPECT_CU(cuProfilerStop());
  EXPECT_RT(cudaProfilerStart());
  EXPECT_RT(cudaProfilerStop());
  std::thread([] { EXPECT_EQ(cuProfilerStart(), CUDA_ERROR_INVALID_CONTEXT); }).join();
}

TEST_F(DeviceControl, H100LimitsThatCodeDividesBy) {
  cudaDeviceProp prop{};
  ASSERT_RT(cudaGetDeviceProperties(&prop, 0));
  EXPECT_EQ(prop.maxThreadsPerMultiProcessor, 2048);
  EXPECT_EQ(prop.maxBlocksPerMultiProcessor, 32);
  EXPECT_EQ(prop.sharedMemPerBlock, 48u * 1024);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 227u * 1024);
  EXPECT_EQ(prop.sharedMemPerMultiprocessor, 228u * 1024);
  EXPECT_EQ(prop.regsPerBlock, 65536);
  EXPECT_EQ(prop.maxThreadsDim[0], 1024);
  EXPECT_EQ(prop.maxThreadsDim[2], 64);
  EXPECT_EQ(prop.maxGridSize[0], 2147483647);
  EXPECT_EQ(prop.maxGridSize[1], 65535);
  EXPECT_EQ(prop.multiProcessorCount, 132);
  int v = 0;
  ASSERT_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 0));
  EXPECT_EQ(v, 65536);
}

// ---- export tables ----
TEST_F(DeviceControl, ExportTablesServeTheRuntimeUpToTheIntegrityCheck) {
  auto uuid = [](const char* hex) {
    CUuuid id{};
    for (int i = 0; i < 16; ++i) id.bytes[i] = static_cast<char>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
    return id;
  };
  const void* table = nullptr;
  CUuuid cudart = uuid("6bd5fb6c5bf4e74a8987d93912fd9df9");
  ASSERT_CU(cuGetExportTable(&table, &cudart));
  const void* const* slots = static_cast<const void* const*>(table);
  EXPECT_GE(reinterpret_cast<uintptr_t>(slots[0]), 3 * sizeof(void*));  // size in bytes
  CUcontext primary = nullptr;
  ASSERT_CU(reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(const_cast<void*>(slots[2]))(&primary, 0));
  EXPECT_EQ(primary, ctx_);
  CUuuid integrity = uuid("d4082055bde6704b8d34ba123c66e1f2");
  ASSERT_CU(cuGetExportTable(&table, &integrity));
  std::uint64_t digest[2] = {0, 0};
  auto check = reinterpret_cast<CUresult (*)(unsigned, std::uint64_t, std::uint64_t*)>(
      const_cast<void*>(static_cast<const void* const*>(table)[1]));
  EXPECT_EQ(check(13000, 0, digest), CUDA_ERROR_NOT_SUPPORTED);
  CUuuid unknown = uuid("f8cff95121468b4eb9e2fb469e7c0dd9");
  EXPECT_EQ(cuGetExportTable(&table, &unknown), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(table, nullptr);
  EXPECT_EQ(cuGetExportTable(nullptr, &unknown), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace fakecuda_test
