// The simulated device stops the process at any use of a destroyed or never-created handle, as a
// sanitizer would: NVIDIA's driver dereferences such handles and crashes (design-notes §9), so no
// test may pass through such a call. Each kind of handle, and each way it dies, has a case here.
#include <sys/mman.h>

#include <regex>
#include <set>

#include "test_util.h"

namespace fakecuda_test {
namespace {

// The one line a misuse prints, and the exit status it ends with (handles.h: kMisuseExitStatus).
constexpr int kMisuseStatus = 86;
#define EXPECT_MISUSE(stmt, regex) EXPECT_EXIT(stmt, ::testing::ExitedWithCode(kMisuseStatus), "^fakecuda: misuse: " regex)

class MisuseRuntime : public RuntimeTest {};
class Misuse : public DriverTest {};

// The issue's own case: a program (no shim) records an event on a stream it destroyed.
TEST_F(MisuseRuntime, RecordingAnEventOnADestroyedStreamStopsTheProgram) {
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_RT(cudaEventCreate(&e));
  ASSERT_RT(cudaStreamDestroy(s));
  EXPECT_MISUSE(cudaEventRecord(e, s),
                "cuEventRecord: stream 0x[0-9a-f]+ was destroyed \\(cuStreamDestroy_v2\\)\n$");
}

TEST_F(MisuseRuntime, ExitsAtOnceWithItsOwnStatusAndOneLine) {
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  ASSERT_RT(cudaStreamDestroy(s));
  // No atexit handler runs (an interposer's exit report would otherwise follow the line).
  EXPECT_EXIT(
      {
        std::atexit([] { fprintf(stderr, "atexit ran\n"); });
        cudaStreamSynchronize(s);
      },
      ::testing::ExitedWithCode(kMisuseStatus),
      "^fakecuda: misuse: cuStreamSynchronize: stream 0x[0-9a-f]+ was destroyed \\(cuStreamDestroy_v2\\)\n$");
}

TEST_F(Misuse, StreamDestroyedByEitherDestroyCall) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamDestroy(s));  // cuStreamDestroy_v2 through cuda.h
  EXPECT_MISUSE(cuStreamDestroy(s), "cuStreamDestroy_v2: stream 0x[0-9a-f]+ was destroyed \\(cuStreamDestroy_v2\\)");
  CUstream t = nullptr;
  ASSERT_CU(cuStreamCreate(&t, 0));
  // The CUDA 2.0 symbol, which older binaries and cuGetProcAddress(version < 4000) reach.
  using V1 = CUresult (*)(CUstream);
  void* v1 = nullptr;
  CUdriverProcAddressQueryResult found{};
  ASSERT_CU(cuGetProcAddress("cuStreamDestroy", &v1, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
  ASSERT_CU(reinterpret_cast<V1>(v1)(t));
  EXPECT_MISUSE(cuStreamQuery(t), "cuStreamQuery: stream 0x[0-9a-f]+ was destroyed \\(cuStreamDestroy\\)");
}

TEST_F(Misuse, HandlesAreNeverRecycled) {
  std::set<CUstream> seen;
  CUstream first = nullptr;
  for (int i = 0; i < 100; ++i) {
    CUstream s = nullptr;
    ASSERT_CU(cuStreamCreate(&s, 0));
    EXPECT_TRUE(seen.insert(s).second);
    if (i == 0) first = s;
    ASSERT_CU(cuStreamDestroy(s));
  }
  // However many streams came since, the first handle is still a destroyed one.
  EXPECT_MISUSE(cuStreamQuery(first), "cuStreamQuery: stream 0x[0-9a-f]+ was destroyed");
}

TEST_F(Misuse, SpecialStreamsAreValid) {
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, 0));
  for (CUstream s : {CUstream{}, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
    EXPECT_CU(cuEventRecord(e, s));
    EXPECT_CU(cuStreamSynchronize(s));
  }
  ASSERT_CU(cuEventDestroy(e));
  // Destroying one is an error, not a crash, on an H100 (2026-11-26).
  for (CUstream s : {CUstream{}, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) EXPECT_EQ(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(Misuse, NeverCreatedAndWrongKindHandles) {
  EXPECT_MISUSE(cuStreamQuery(reinterpret_cast<CUstream>(0x1234)), "cuStreamQuery: stream 0x1234 was never created\n$");
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, 0));
  EXPECT_MISUSE(cuStreamQuery(reinterpret_cast<CUstream>(e)),
                "cuStreamQuery: 0x[0-9a-f]+ is no stream: it is a handle of another kind \\(event\\)\n$");
  ASSERT_CU(cuEventDestroy(e));
  EXPECT_MISUSE(cuStreamQuery(reinterpret_cast<CUstream>(e)),
                "cuStreamQuery: 0x[0-9a-f]+ is no stream: it is a handle of another kind \\(event\\), destroyed "
                "\\(cuEventDestroy_v2\\)\n$");
}

TEST_F(Misuse, Events) {
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventDestroy(e));
  EXPECT_MISUSE(cuEventRecord(e, nullptr), "cuEventRecord: event 0x[0-9a-f]+ was destroyed \\(cuEventDestroy_v2\\)");
  EXPECT_MISUSE(cuEventQuery(e), "cuEventQuery: event 0x[0-9a-f]+ was destroyed");
  EXPECT_MISUSE(cuEventSynchronize(e), "cuEventSynchronize: event 0x[0-9a-f]+ was destroyed");
  EXPECT_MISUSE(cuStreamWaitEvent(nullptr, e, 0), "cuStreamWaitEvent: event 0x[0-9a-f]+ was destroyed");
  EXPECT_MISUSE(cuEventDestroy(e), "cuEventDestroy_v2: event 0x[0-9a-f]+ was destroyed");
}

TEST_F(Misuse, GraphsAndGraphExecs) {
  CUgraph g = nullptr;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphExec x = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&x, g, 0));
  ASSERT_CU(cuGraphExecDestroy(x));
  EXPECT_MISUSE(cuGraphLaunch(x, nullptr), "cuGraphLaunch: graph exec 0x[0-9a-f]+ was destroyed \\(cuGraphExecDestroy\\)");
  ASSERT_CU(cuGraphDestroy(g));
  EXPECT_MISUSE(cuGraphInstantiateWithFlags(&x, g, 0),
                "cuGraphInstantiateWithFlags: graph 0x[0-9a-f]+ was destroyed \\(cuGraphDestroy\\)");
  CUgraphNode n = nullptr;
  EXPECT_MISUSE(cuGraphAddEmptyNode(&n, g, nullptr, 0), "cuGraphAddEmptyNode: graph 0x[0-9a-f]+ was destroyed");
}

TEST_F(Misuse, MemoryPools) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuMemPoolCreate(&pool, &props));
  ASSERT_CU(cuMemPoolDestroy(pool));
  CUdeviceptr p = 0;
  EXPECT_MISUSE(cuMemAllocFromPoolAsync(&p, 4096, pool, nullptr),
                "cuMemAllocFromPoolAsync: memory pool 0x[0-9a-f]+ was destroyed \\(cuMemPoolDestroy\\)");
  cuuint64_t v = 0;
  EXPECT_MISUSE(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
                "cuMemPoolGetAttribute: memory pool 0x[0-9a-f]+ was destroyed");
  // The default pool is the device's: it cannot be destroyed (an error), and outlives resets.
  CUmemoryPool def = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&def, 0));
  EXPECT_EQ(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Misuse, ContextsAndTheirHandles) {
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  CUstream s = nullptr;
  CUevent e = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  ASSERT_CU(cuEventCreate(&e, 0));
  ASSERT_CU(cuCtxDestroy(c));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  EXPECT_MISUSE(cuCtxSetCurrent(c), "cuCtxSetCurrent: context 0x[0-9a-f]+ was destroyed \\(cuCtxDestroy_v2\\)");
  EXPECT_MISUSE(cuCtxPushCurrent(c), "cuCtxPushCurrent_v2: context 0x[0-9a-f]+ was destroyed");
  EXPECT_MISUSE(cuStreamQuery(s), "cuStreamQuery: stream 0x[0-9a-f]+ was destroyed \\(cuCtxDestroy_v2\\)");
  EXPECT_MISUSE(cuEventQuery(e), "cuEventQuery: event 0x[0-9a-f]+ was destroyed \\(cuCtxDestroy_v2\\)");
}

TEST_F(Misuse, PrimaryContextResetAndLastReleaseDestroyEverythingOfTheContext) {
  CUstream s = nullptr;
  CUevent e = nullptr;
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&e, 0));
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuMemPoolCreate(&pool, &props));
  ASSERT_CU(cuDevicePrimaryCtxReset(0));
  CUcontext again = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&again, 0));
  EXPECT_EQ(again, ctx_);  // the primary context's handle survives its reset
  EXPECT_MISUSE(cuEventRecord(e, s), "cuEventRecord: event 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxReset_v2\\)");
  EXPECT_MISUSE(cuStreamQuery(s), "cuStreamQuery: stream 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxReset_v2\\)");
  EXPECT_MISUSE(cuGraphDestroy(g), "cuGraphDestroy: graph 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxReset_v2\\)");
  EXPECT_MISUSE(cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo: memory pool 0x[0-9a-f]+ was destroyed");
  // The last release ends the context the same way.
  ASSERT_CU(cuStreamCreate(&s, 0));
  // The reset kept the fixture's retain: two to give back.
  ASSERT_CU(cuDevicePrimaryCtxRelease(0));
  ASSERT_CU(cuDevicePrimaryCtxRelease(0));
  ASSERT_CU(cuDevicePrimaryCtxRetain(&again, 0));
  EXPECT_MISUSE(cuStreamQuery(s), "cuStreamQuery: stream 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxRelease_v2\\)");
}

TEST_F(MisuseRuntime, DeviceResetDestroysStreamsAndEvents) {
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_RT(cudaEventCreate(&e));
  ASSERT_RT(cudaDeviceReset());
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 1 << 20));  // the device itself works again
  ASSERT_RT(cudaFree(p));
  EXPECT_MISUSE(cudaEventRecord(e, nullptr), "cuEventRecord: event 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxReset_v2\\)");
  EXPECT_MISUSE(cudaMallocAsync(&p, 64, s), "cuMemAllocAsync: stream 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxReset_v2\\)");
}

TEST_F(Misuse, ArraysDestroyedByEitherDestroyOrTheirContext) {
  CUDA_ARRAY_DESCRIPTOR d{64, 64, CU_AD_FORMAT_FLOAT, 1};  // width, height, format, channels
  CUarray a = nullptr;
  ASSERT_CU(cuArrayCreate(&a, &d));
  ASSERT_CU(cuArrayDestroy(a));
  EXPECT_MISUSE(cuArrayDestroy(a), "cuArrayDestroy: CUDA array 0x[0-9a-f]+ was destroyed \\(cuArrayDestroy\\)");
  CUDA_ARRAY3D_DESCRIPTOR d3{32, 32, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};  // width, height, depth, format, channels, flags
  CUmipmappedArray m = nullptr;
  ASSERT_CU(cuMipmappedArrayCreate(&m, &d3, 3));
  // A mipmapped array is no array, and the other way round.
  EXPECT_MISUSE(cuArrayDestroy(reinterpret_cast<CUarray>(m)), "cuArrayDestroy: 0x[0-9a-f]+ is no CUDA array");
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  ASSERT_CU(cuArrayCreate(&a, &d));
  ASSERT_CU(cuCtxDestroy(c));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  EXPECT_MISUSE(cuArrayDestroy(a), "cuArrayDestroy: CUDA array 0x[0-9a-f]+ was destroyed \\(cuCtxDestroy_v2\\)");
  EXPECT_EQ(cuArrayDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_CU(cuMipmappedArrayDestroy(m));
}

TEST_F(Misuse, PhysicalMemoryAndMappings) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU(cuMemCreate(&h, gran, &prop, 0));
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
  ASSERT_CU(cuMemMap(va, gran, 0, h, 0));
  ASSERT_CU(cuMemRelease(h));  // still mapped: the memory lives, the handle is gone
  EXPECT_MISUSE(cuMemMap(va + gran, gran, 0, h, 0), "cuMemMap: physical memory handle 0x[0-9a-f]+ was destroyed \\(cuMemRelease\\)");
  // cuMemRetainAllocationHandle gives the same handle back to life.
  CUmemGenericAllocationHandle again = 0;
  ASSERT_CU(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va)));
  EXPECT_EQ(again, h);
  ASSERT_CU(cuMemRelease(again));
  ASSERT_CU(cuMemUnmap(va, gran));
  EXPECT_MISUSE(cuMemUnmap(va, gran), "cuMemUnmap: nothing is mapped at 0x[0-9a-f]+ \\(never mapped, or unmapped already\\)");
  CUmemAccessDesc rw{};
  rw.location = prop.location;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_MISUSE(cuMemSetAccess(va, gran, &rw, 1), "cuMemSetAccess: nothing is mapped at 0x[0-9a-f]+");
  ASSERT_CU(cuMemAddressFree(va, 2 * gran));
  EXPECT_MISUSE(cuMemAddressFree(va, 2 * gran), "cuMemAddressFree: no reservation starts at 0x[0-9a-f]+");
}

// A host function or stream callback "must not make any CUDA API calls" (cuLaunchHostFunc,
// cuStreamAddCallback): one that does may deadlock on its own stream on a GPU.
TEST_F(Misuse, DriverCallsFromHostFunctionsAndCallbacks) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  static CUcontext ctx = ctx_;
  static std::atomic<int> plain_runs{0};
  // A host function that makes no CUDA call is fine, from every way of enqueueing one.
  ASSERT_CU(cuLaunchHostFunc(s, [](void*) { ++plain_runs; }, nullptr));
  ASSERT_CU(cuStreamAddCallback(s, [](CUstream, CUresult, void*) { ++plain_runs; }, nullptr, 0));
  CUgraph g = nullptr;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUDA_HOST_NODE_PARAMS plain{[](void*) { ++plain_runs; }, nullptr};
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphAddHostNode(&node, g, nullptr, 0, &plain));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(plain_runs.load(), 3);

  auto synchronizes = [](void*) {
    cuCtxSetCurrent(ctx);
    cuCtxSynchronize();
  };
  EXPECT_MISUSE(
      {
        cuLaunchHostFunc(s, synchronizes, nullptr);
        cuStreamSynchronize(s);
      },
      "a CUDA driver call from inside a host function enqueued with cuLaunchHostFunc");
  EXPECT_MISUSE(
      {
        cuStreamAddCallback(s, [](CUstream, CUresult, void*) { cuCtxSynchronize(); }, nullptr, 0);
        cuStreamSynchronize(s);
      },
      "a CUDA driver call from inside a host function enqueued with cuStreamAddCallback");
  CUgraph g2 = nullptr;
  ASSERT_CU(cuGraphCreate(&g2, 0));
  CUDA_HOST_NODE_PARAMS calls{synchronizes, nullptr};
  ASSERT_CU(cuGraphAddHostNode(&node, g2, nullptr, 0, &calls));
  CUgraphExec exec2 = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec2, g2, 0));
  EXPECT_MISUSE(
      {
        cuGraphLaunch(exec2, s);
        cuStreamSynchronize(s);
      },
      "a CUDA driver call from inside a host function enqueued with cuGraphAddHostNode");
  ASSERT_CU(cuGraphExecDestroy(exec2));
  ASSERT_CU(cuGraphDestroy(g2));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuStreamDestroy(s));
}

// Memory CUDA leaves undefined to touch: the simulated device took a freed device address for
// pageable host memory (cudaMemcpyDefault, the host side of HtoD/DtoH) and copied into the next
// owner's bytes, and let work issued after cuMemFreeAsync, or graph memory before its launch, run.
TEST_F(MisuseRuntime, CopiesThroughFreedDeviceMemory) {
  char* a = nullptr;
  char* keep = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&a), 4096));
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&keep), 4096));  // a's range is a hole, not the free tail
  ASSERT_RT(cudaFree(a));
  char host[64] = {};
  const char* unheld = "is device memory no allocation holds \\(freed, or never allocated\\)";
  EXPECT_MISUSE(cudaMemcpy(a, host, sizeof host, cudaMemcpyDefault), "cuMemcpy: \\[0x[0-9a-f]+, 0x[0-9a-f]+\\) " + std::string(unheld));
  EXPECT_MISUSE(cudaMemcpy(host, a, sizeof host, cudaMemcpyDefault), "cuMemcpy: .*" + std::string(unheld));
  EXPECT_MISUSE(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost), "cuMemcpyDtoH_v2: .*" + std::string(unheld));
  EXPECT_MISUSE(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice), "cuMemcpyHtoD_v2: .*" + std::string(unheld));
  EXPECT_MISUSE(cudaMemsetAsync(a, 0, 64, nullptr), "cuMemsetD8Async: .*" + std::string(unheld));
  // Host pointers are still anybody's: an address outside the device's memory is pageable memory.
  char other[64] = {};
  ASSERT_RT(cudaMemcpy(other, host, sizeof host, cudaMemcpyDefault));
  ASSERT_RT(cudaFree(keep));
}

TEST_F(MisuseRuntime, ACopyWhoseHostSideIsDeviceMemory) {
  char* a = nullptr;
  char* b = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&a), 4096));
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&b), 4096));
  EXPECT_MISUSE(cudaMemcpy(a, b, 64, cudaMemcpyHostToDevice),
                "cuMemcpyHtoD_v2: the host side \\[0x[0-9a-f]+, 0x[0-9a-f]+\\) is device memory");
  EXPECT_MISUSE(cudaMemcpy(a, b, 64, cudaMemcpyDeviceToHost), "cuMemcpyDtoH_v2: the host side .* is device memory");
  // Pinned and managed memory are host memory to these copies.
  void* pinned = nullptr;
  void* managed = nullptr;
  ASSERT_RT(cudaMallocHost(&pinned, 4096));
  ASSERT_RT(cudaMallocManaged(&managed, 4096));
  ASSERT_RT(cudaMemcpy(a, pinned, 64, cudaMemcpyHostToDevice));
  ASSERT_RT(cudaMemcpy(managed, b, 64, cudaMemcpyDeviceToHost));
  ASSERT_RT(cudaFreeHost(pinned));
  ASSERT_RT(cudaFree(managed));
  ASSERT_RT(cudaFree(a));
  ASSERT_RT(cudaFree(b));
}

TEST_F(MisuseRuntime, WorkAndQueriesAfterAStreamOrderedFree) {
  cudaStream_t s = nullptr, t = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_RT(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
  void* p = nullptr;
  ASSERT_RT(cudaMallocAsync(&p, 1 << 20, s));
  ASSERT_RT(fakecuLaunchDelayedFill(reinterpret_cast<CUdeviceptr>(p), 1, 1 << 20, 200000, reinterpret_cast<CUstream>(s)));
  ASSERT_RT(cudaFreeAsync(p, s));  // still queued behind the fill: the allocation exists, freed
  const char* freed = "is in the allocation at 0x[0-9a-f]+, which was freed";
  EXPECT_MISUSE(cudaMemsetAsync(p, 0, 64, t), "cuMemsetD8Async: .*" + std::string(freed));
  EXPECT_MISUSE(cudaMemsetAsync(p, 0, 64, s), "cuMemsetD8Async: .*" + std::string(freed));
  cudaPointerAttributes attrs{};
  EXPECT_MISUSE(cudaPointerGetAttributes(&attrs, p), "cuPointerGetAttributes: 0x[0-9a-f]+ " + std::string(freed));
  ASSERT_RT(cudaStreamSynchronize(s));
  // Once the stream has reached the free, still undefined: "After this API returns" (a review
  // helper found the simulated device answering a second free and every query here).
  const char* gone = "is in the allocation at 0x[0-9a-f]+, which was freed with cuMemFreeAsync \\(and its stream "
                     "has reached the free\\)";
  const CUdeviceptr inside = reinterpret_cast<CUdeviceptr>(p) + 100;
  unsigned type = 0;
  EXPECT_MISUSE(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside),
                "cuPointerGetAttribute: 0x[0-9a-f]+ " + std::string(gone));
  EXPECT_MISUSE(cudaPointerGetAttributes(&attrs, p), "cuPointerGetAttributes: 0x[0-9a-f]+ " + std::string(gone));
  CUdeviceptr base = 0;
  size_t size = 0;
  EXPECT_MISUSE(cuMemGetAddressRange(&base, &size, inside), "cuMemGetAddressRange: 0x[0-9a-f]+ " + std::string(gone));
  // Until an allocation takes the address again: then the query is of that allocation, and once a
  // cuMemFree gave it back, CUDA refuses it (a defined answer).
  void* again = nullptr;
  ASSERT_RT(cudaMalloc(&again, 1 << 20));
  ASSERT_EQ(again, p);
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  ASSERT_RT(cudaFree(again));
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside), CUDA_ERROR_INVALID_VALUE);
  ASSERT_RT(cudaStreamDestroy(s));
  ASSERT_RT(cudaStreamDestroy(t));
}

// cuMemFreeAsync on one stream of memory another stream's queued work still uses, with nothing
// ordering the free after it: "The allocation must not be accessed after stream execution reaches
// the free". The simulated device released it under the other stream's work, and the next
// allocation at that address read the late work's bytes (a review helper's reproducer; until
// 2026-11-30 Streams.ReuseWithoutWaitingCorruptsTheNewOwner held it to that corruption).
TEST_F(MisuseRuntime, AStreamOrderedFreeUnorderedAfterAnotherStreamsWork) {
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_RT(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  void* p = nullptr;
  ASSERT_RT(cudaMallocAsync(&p, 1 << 20, a));
  ASSERT_RT(cudaStreamSynchronize(a));
  // Ordered by an event: the free waits for a's work, and nothing is wrong.
  cudaEvent_t done = nullptr;
  ASSERT_RT(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  ASSERT_RT(fakecuLaunchDelayedFill(reinterpret_cast<CUdeviceptr>(p), 1, 1 << 20, 50000, reinterpret_cast<CUstream>(a)));
  ASSERT_RT(cudaEventRecord(done, a));
  ASSERT_RT(cudaStreamWaitEvent(b, done, 0));
  ASSERT_RT(cudaFreeAsync(p, b));
  ASSERT_RT(cudaStreamSynchronize(b));
  ASSERT_RT(cudaMallocAsync(&p, 1 << 20, a));
  ASSERT_RT(cudaStreamSynchronize(a));
  ASSERT_RT(fakecuLaunchDelayedFill(reinterpret_cast<CUdeviceptr>(p), 1, 1 << 20, 200000, reinterpret_cast<CUstream>(a)));
  EXPECT_MISUSE(
      {
        cudaFreeAsync(p, b);
        cudaStreamSynchronize(b);
      },
      "cuMemFreeAsync reached on its stream of \\[0x[0-9a-f]+, 0x[0-9a-f]+\\) while work queued on stream 0x[0-9a-f]+ "
      "still accesses");
  ASSERT_RT(cudaStreamSynchronize(a));
  ASSERT_RT(cudaFreeAsync(p, a));
  ASSERT_RT(cudaStreamSynchronize(a));
  ASSERT_RT(cudaEventDestroy(done));
  ASSERT_RT(cudaStreamDestroy(a));
  ASSERT_RT(cudaStreamDestroy(b));
}

// cudaFree / cuMemFree of stream-ordered memory: "will not perform any implicit synchronization
// ... Callers must ensure that all accesses to these pointer have completed". The simulated
// device synchronized there, which let a free race its own stream's work unseen.
TEST_F(MisuseRuntime, PlainFreeOfStreamOrderedMemoryWaitsForNothing) {
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  void* busy = nullptr;
  ASSERT_RT(cudaMallocAsync(&p, 1 << 20, s));
  ASSERT_RT(cudaMallocAsync(&busy, 1 << 20, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  // Work queued on another allocation: p's free neither waits for it nor is it wrong.
  ASSERT_RT(fakecuLaunchDelayedFill(reinterpret_cast<CUdeviceptr>(busy), 1, 1 << 20, 200000, reinterpret_cast<CUstream>(s)));
  const unsigned long long syncs = fakecudaDeviceSyncCount();
  ASSERT_RT(cudaFree(p));
  EXPECT_EQ(fakecudaDeviceSyncCount(), syncs);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);  // the fill still runs
  // Work still queued on the memory freed: the program's error.
  EXPECT_MISUSE(cudaFree(busy), "cuMemFree_v2 of \\[0x[0-9a-f]+, 0x[0-9a-f]+\\) while work queued on stream");
  ASSERT_RT(cudaStreamSynchronize(s));
  ASSERT_RT(cudaFree(busy));
  ASSERT_RT(cudaStreamDestroy(s));
}

// cuMemAllocAsync: "The allocation must not be accessed until the the allocation operation
// completes", which another stream's work is ordered after only by an event (or a
// synchronization). The simulated device allocates at once, and let such work run.
TEST_F(MisuseRuntime, WorkOnAnotherStreamBeforeTheAllocationIsReached) {
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_RT(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  void* busy = nullptr;
  ASSERT_RT(cudaMalloc(&busy, 4096));
  ASSERT_RT(fakecuLaunchDelayedFill(reinterpret_cast<CUdeviceptr>(busy), 1, 4096, 200000, reinterpret_cast<CUstream>(a)));
  void* p = nullptr;
  ASSERT_RT(cudaMallocAsync(&p, 4096, a));  // behind the fill in a's order
  EXPECT_MISUSE(
      {
        cudaMemsetAsync(p, 0, 64, b);
        cudaStreamSynchronize(b);
      },
      "work on stream 0x[0-9a-f]+ accesses \\[0x[0-9a-f]+, 0x[0-9a-f]+\\) before stream 0x[0-9a-f]+ reached its "
      "allocation");
  // Ordered by an event recorded after the allocation: the program's to use.
  cudaEvent_t allocated = nullptr;
  ASSERT_RT(cudaEventCreateWithFlags(&allocated, cudaEventDisableTiming));
  ASSERT_RT(cudaEventRecord(allocated, a));
  ASSERT_RT(cudaStreamWaitEvent(b, allocated, 0));
  ASSERT_RT(cudaMemsetAsync(p, 0, 64, b));
  ASSERT_RT(cudaStreamSynchronize(b));
  ASSERT_RT(cudaFreeAsync(p, b));
  ASSERT_RT(cudaStreamSynchronize(b));
  ASSERT_RT(cudaEventDestroy(allocated));
  ASSERT_RT(cudaFree(busy));
  ASSERT_RT(cudaStreamDestroy(a));
  ASSERT_RT(cudaStreamDestroy(b));
}

TEST_F(MisuseRuntime, GraphMemoryBeforeItsLaunch) {
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  ASSERT_RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  ASSERT_RT(cudaMallocAsync(&p, 4096, s));
  ASSERT_RT(cudaMemsetAsync(p, 7, 4096, s));  // captured after its allocation: the graph's to use
  cudaGraph_t g = nullptr;
  ASSERT_RT(cudaStreamEndCapture(s, &g));
  char host[16] = {};
  EXPECT_MISUSE(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost),
                "cuMemcpyDtoH_v2: .* is graph memory no launch of its graph has made yet");
  cudaGraphExec_t x = nullptr;
  ASSERT_RT(cudaGraphInstantiate(&x, g, 0));
  ASSERT_RT(cudaGraphLaunch(x, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  ASSERT_RT(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));  // after the launch: the program's
  EXPECT_EQ(host[0], 7);
  ASSERT_RT(cudaFreeAsync(p, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  ASSERT_RT(cudaGraphExecDestroy(x));
  ASSERT_RT(cudaGraphDestroy(g));
  ASSERT_RT(cudaStreamDestroy(s));
}

// Argument checks that are errors, not misuse: what CUDA documents or a real GPU answered.
TEST_F(Misuse, EventAndStreamOfDifferentContextsIsAnInvalidHandle) {
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUcontext popped = nullptr;
  ASSERT_CU(cuCtxPopCurrent(&popped));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  EXPECT_EQ(cuEventRecord(e, s), CUDA_ERROR_INVALID_HANDLE);        // H100, 2026-11-26
  EXPECT_EQ(cuEventRecord(e, nullptr), CUDA_ERROR_INVALID_HANDLE);  // the current context's default stream
  ASSERT_CU(cuEventDestroy(e));
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuCtxDestroy(c));
}

}  // namespace
}  // namespace fakecuda_test
