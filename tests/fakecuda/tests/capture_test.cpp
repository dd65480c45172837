// Stream capture: recorded-not-executed work, the legality rules that let tests catch a pool that
// synchronizes or allocates during capture, graph memory, and the minimal graph objects.
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.h"

namespace fakecuda_test {
namespace {

constexpr size_t kBytes = 4096;

class Capture : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    ASSERT_CU(cuMemAlloc(&buf_, kBytes));
    ASSERT_CU(cuMemsetD8(buf_, 0, kBytes));
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_DEFAULT));
  }
  void TearDown() override {
    CUstreamCaptureStatus st;
    if (cuStreamIsCapturing(s_, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) {
      CUgraph g = nullptr;
      cuStreamEndCapture(s_, &g);
      if (g != nullptr) cuGraphDestroy(g);
    }
    cuStreamDestroy(s_);
    cuMemFree(buf_);
    DriverTest::TearDown();
  }
  unsigned char At(size_t i) const { return reinterpret_cast<const unsigned char*>(buf_)[i]; }
  CUstreamCaptureStatus Status(CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    EXPECT_CU(cuStreamIsCapturing(s, &st));
    return st;
  }

  CUdeviceptr buf_ = 0;
  CUstream s_ = nullptr;
};

TEST_F(Capture, WorkIsRecordedNotExecutedAndReplayedByLaunch) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_CU(cuMemsetD8Async(buf_, 5, kBytes, s_));
  ASSERT_CU(fakecuLaunchDelayedFill(buf_, 6, 16, 0, s_));
  CUstreamCaptureStatus st;
  cuuint64_t id = 0;
  CUgraph during = nullptr;
  ASSERT_CU(cuStreamGetCaptureInfo(s_, &st, &id, &during, nullptr, nullptr, nullptr));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(id, 0u);
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(At(0), 0);  // nothing ran
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(At(0), 6);
  EXPECT_EQ(At(100), 5);
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
}

TEST_F(Capture, LegacyStreamCannotCaptureAndDoubleBeginFails) {
  EXPECT_EQ(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_ERROR_ILLEGAL_STATE);
  CUgraph g = nullptr;
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(cuStreamEndCapture(other, &g), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_CU(cuStreamDestroy(other));
}

TEST_F(Capture, DeviceSynchronizeDuringGlobalCaptureInvalidatesIt) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD8Async(buf_, 5, kBytes, s_));
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(cuMemsetD8Async(buf_, 5, kBytes, s_), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUgraph g = reinterpret_cast<CUgraph>(0x1);
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_CU(cuCtxSynchronize());  // legal again once the capture ended
}

TEST_F(Capture, SynchronizingOrQueryingTheCapturingStreamFails) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(cuStreamSynchronize(s_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(cuStreamQuery(s_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_F(Capture, EventsRecordedInCaptureCannotBeObserved) {
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  // Global mode: any event query by the capturing thread is prohibited.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(e, s_));
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // Relaxed mode: the query is allowed, but the event belongs to the capture.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuEventRecord(e, s_));
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
  EXPECT_EQ(cuEventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT);
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // Recorded again outside capture, it is an ordinary event.
  ASSERT_CU(cuEventRecord(e, s_));
  ASSERT_CU(cuEventSynchronize(e));
  ASSERT_CU(cuEventDestroy(e));
}

// What an H200 answered during capture (2026-11-27, docs/gpu-validation.md run 5): reading any
// attribute of a memory pool, trimming it, and stream-ordered allocation on a stream that is not
// capturing are "potentially unsafe" calls; a captured allocation names no pool.
TEST_F(Capture, PoolQueriesAndOtherStreamsAllocationsFollowTheCaptureMode) {
  CUdevice dev = 0;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&pool, dev));
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  cuuint64_t v = 0;
  CUdeviceptr p = 0;
  using Call = std::function<CUresult()>;
  const std::vector<std::pair<const char*, Call>> unsafe = {
      {"reserved", [&] { return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v); }},
      {"used", [&] { return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v); }},
      {"threshold", [&] { return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v); }},
      {"trim", [&] { return cuMemPoolTrimTo(pool, 0); }},
      {"alloc on another stream", [&] { return cuMemAllocAsync(&p, 4096, other); }},
  };
  for (const auto& entry : unsafe) {
    // Not a structured binding: the lambdas below capture `call`, which clang 14 refuses for one.
    const Call& call = entry.second;
    SCOPED_TRACE(entry.first);
    CUgraph g = nullptr;
    ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUdeviceptr graph_memory = 0;
    ASSERT_CU(cuMemAllocAsync(&graph_memory, 1 << 20, s_));  // the capturing stream's own: legal
    CUmemoryPool owner = nullptr;
    EXPECT_EQ(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, graph_memory),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_EQ(call(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // Another thread's call conflicts with a global capture, not with a thread-local one.
    ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult from_other = CUDA_SUCCESS;
    std::thread([&] {
      CUcontext ctx = nullptr;
      cuDevicePrimaryCtxRetain(&ctx, dev);
      cuCtxSetCurrent(ctx);
      from_other = call();
      cuDevicePrimaryCtxRelease(dev);
    }).join();
    EXPECT_EQ(from_other, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    std::thread([&] {
      CUcontext ctx = nullptr;
      cuDevicePrimaryCtxRetain(&ctx, dev);
      cuCtxSetCurrent(ctx);
      from_other = call();
      if (from_other == CUDA_SUCCESS && p != 0) from_other = cuMemFreeAsync(p, other);
      p = 0;
      cuDevicePrimaryCtxRelease(dev);
    }).join();
    EXPECT_CU(from_other);
    ASSERT_CU(cuStreamEndCapture(s_, &g));
    ASSERT_CU(cuGraphDestroy(g));
    // Relaxed: every one of them works.
    ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_CU(call());
    if (p != 0) {
      EXPECT_CU(cuMemFreeAsync(p, other));
    }
    p = 0;
    ASSERT_CU(cuStreamEndCapture(s_, &g));
    ASSERT_CU(cuGraphDestroy(g));
  }
  ASSERT_CU(cuStreamSynchronize(other));
  ASSERT_CU(cuStreamDestroy(other));
}

TEST_F(Capture, MemAllocAndFreeFollowTheCaptureMode) {
  const auto allocs = fakecudaDriverAllocCount();
  CUdeviceptr p = 0;
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuMemAlloc(&p, 1024), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(fakecudaDriverAllocCount(), allocs);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // Relaxed mode (what PyTorch uses) permits cuMemAlloc and cuMemFree.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuMemAlloc(&p, 1024));
  ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));
  // So does a thread that switched itself to relaxed.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemAlloc(&p, 1024));
  ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
}

TEST_F(Capture, GlobalCaptureRestrictsOtherThreadsThreadLocalDoesNot) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  std::thread([this] {
    cuCtxSetCurrent(ctx_);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }).join();
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  std::thread([this] {
    cuCtxSetCurrent(ctx_);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT_CU(cuCtxSynchronize());
  }).join();
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));

  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  std::thread([this] {
    cuCtxSetCurrent(ctx_);
    EXPECT_CU(cuCtxSynchronize());
    CUdeviceptr p = 0;
    EXPECT_CU(cuMemAlloc(&p, 64));
    EXPECT_CU(cuMemFree(p));
  }).join();
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);  // but this thread may not
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_F(Capture, EndingFromAnotherThreadFails) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  std::thread([this] {
    cuCtxSetCurrent(ctx_);
    CUgraph g = nullptr;
    EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  }).join();
  // ... and ends the capture all the same (an H200, 2026-11-27).
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_NONE);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_ILLEGAL_STATE);
}

TEST_F(Capture, AllocAsyncDuringCaptureIsGraphMemory) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  const auto allocs = fakecudaDriverAllocCount();
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr kept = 0, scratch = 0;
  ASSERT_CU(cuMemAllocAsync(&kept, 1 << 20, s_));
  ASSERT_CU(cuMemAllocAsync(&scratch, 1 << 20, s_));
  EXPECT_NE(kept, 0u);
  EXPECT_NE(kept, scratch);
  EXPECT_EQ(fakecudaDriverAllocCount(), allocs + 2);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + (2 << 20));
  ASSERT_CU(cuMemsetD8Async(scratch, 1, 1 << 20, s_));
  ASSERT_CU(cuMemFreeAsync(scratch, s_));  // freed inside the graph: the graph owns it
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + (2 << 20));
  // Graph memory exists for the program once a launch has allocated it: before, real GPUs refuse
  // to free it (H200 and H100, 2026-11-26).
  EXPECT_EQ(cuMemFreeAsync(kept, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFreeAsync(kept, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(kept), CUDA_ERROR_INVALID_VALUE);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + (1 << 20));
  // Graph memory not freed by the graph stays with the program.
  ASSERT_CU(cuMemFreeAsync(kept, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
}

TEST_F(Capture, LegacyStreamWorkConflictsWithABlockingCapture) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_EQ(cuMemsetD8Async(buf_, 1, kBytes, nullptr), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // A non-blocking capturing stream does not conflict with the legacy stream.
  CUstream nb = nullptr;
  ASSERT_CU(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamBeginCapture(nb, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuMemsetD8Async(buf_, 1, kBytes, nullptr));
  ASSERT_CU(cuStreamEndCapture(nb, &g));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuStreamDestroy(nb));
}

TEST_F(Capture, ForkAndJoinThroughEvents) {
  CUstream side = nullptr;
  CUevent fork = nullptr, join = nullptr;
  ASSERT_CU(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s_));
  ASSERT_CU(cuStreamWaitEvent(side, fork, 0));
  EXPECT_EQ(Status(side), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_CU(cuMemsetD8Async(buf_, 3, kBytes, side));  // recorded, not run
  ASSERT_CU(cuEventRecord(join, side));
  ASSERT_CU(cuStreamWaitEvent(s_, join, 0));
  // Only the origin stream can end the capture.
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(side, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  EXPECT_EQ(Status(side), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(At(0), 0);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(At(0), 3);
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  // Waiting inside a capture on an event recorded outside it breaks isolation.
  ASSERT_CU(cuEventRecord(fork, side));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuStreamWaitEvent(s_, fork, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_CU(cuEventDestroy(fork));
  ASSERT_CU(cuEventDestroy(join));
  ASSERT_CU(cuStreamDestroy(side));
}

// cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "the capture graph contains a fork that
// was not joined to the primary stream". The simulated device ended such a capture with a graph (a
// review helper's reproducer; PyTorch rejoins its side streams for this reason).
TEST_F(Capture, AForkNotJoinedBackIsRefusedAtTheEnd) {
  CUstream side = nullptr, third = nullptr;
  CUevent fork = nullptr, join = nullptr, late = nullptr;
  ASSERT_CU(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&third, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&late, CU_EVENT_DISABLE_TIMING));
  CUgraph g = nullptr;
  // Work on the side stream the origin never waits for.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s_));
  ASSERT_CU(cuStreamWaitEvent(side, fork, 0));
  ASSERT_CU(cuMemsetD8Async(buf_, 3, kBytes, side));
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(Status(s_), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(Status(side), CU_STREAM_CAPTURE_STATUS_NONE);
  // Joined, then more work on the side stream after the join: unjoined again.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s_));
  ASSERT_CU(cuStreamWaitEvent(side, fork, 0));
  ASSERT_CU(cuMemsetD8Async(buf_, 3, kBytes, side));
  ASSERT_CU(cuEventRecord(join, side));
  ASSERT_CU(cuStreamWaitEvent(s_, join, 0));
  ASSERT_CU(cuMemsetD8Async(buf_, 4, kBytes, side));
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  // A fork that recorded nothing needs no join; a join through a third stream counts.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s_));
  ASSERT_CU(cuStreamWaitEvent(side, fork, 0));
  ASSERT_CU(cuStreamWaitEvent(third, fork, 0));
  ASSERT_CU(cuMemsetD8Async(buf_, 5, kBytes, side));
  ASSERT_CU(cuEventRecord(join, side));
  ASSERT_CU(cuStreamWaitEvent(third, join, 0));
  ASSERT_CU(cuEventRecord(late, third));
  ASSERT_CU(cuStreamWaitEvent(s_, late, 0));
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_NE(g, nullptr);
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuEventDestroy(fork));
  ASSERT_CU(cuEventDestroy(join));
  ASSERT_CU(cuEventDestroy(late));
  ASSERT_CU(cuStreamDestroy(side));
  ASSERT_CU(cuStreamDestroy(third));
}

// cuMemFreeAsync during a capture makes a free node, "and must therefore be passed the address of
// a graph allocation": memory from outside any graph is refused (invalid value, and it stays the
// program's); graph memory of another graph is freed when this one launches.
TEST_F(Capture, AFreeNodeTakesGraphMemoryOnly) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 1 << 20));
  CUdeviceptr q = 0;
  ASSERT_CU(cuMemAllocAsync(&q, 1 << 20, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(cuMemFreeAsync(p, s_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFreeAsync(q, s_), CUDA_ERROR_INVALID_VALUE);
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemsetD8(p, 1, 1 << 20));  // still the program's
  ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuMemFreeAsync(q, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);

  // Graph A allocates and keeps its memory; graph B frees it, at B's launch.
  CUdeviceptr a = 0;
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemAllocAsync(&a, 1 << 20, s_));
  CUgraph ga = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &ga));
  CUgraphExec ea = nullptr;
  ASSERT_CU(cuGraphInstantiate(&ea, ga, 0));
  ASSERT_CU(cuGraphLaunch(ea, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  // A graph that would free it but is destroyed unlaunched frees nothing: still the program's.
  CUgraph never = nullptr;
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemFreeAsync(a, s_));
  ASSERT_CU(cuStreamEndCapture(s_, &never));
  ASSERT_CU(cuGraphDestroy(never));
  ASSERT_CU(cuMemsetD8(a, 2, 1 << 20));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemFreeAsync(a, s_));
  CUgraph gb = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &gb));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + (1 << 20));
  // Until gb launches, a is in use: copies and queries of it are the program's (they stopped the
  // process as if a were freed already: a review helper's find).
  ASSERT_CU(cuMemsetD8(a, 3, 1 << 20));
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAddressRange(&base, &size, a));
  EXPECT_EQ(base, a);
  CUgraphExec eb = nullptr;
  ASSERT_CU(cuGraphInstantiate(&eb, gb, 0));
  ASSERT_CU(cuGraphLaunch(eb, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  // Freed: ga keeps the address (and, as CUDA's graph pool until a trim, the memory) for its next
  // launch, which makes it again; it goes back with ga.
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used + (1 << 20));
  ASSERT_CU(cuGraphLaunch(ea, s_));
  ASSERT_CU(cuMemsetD8Async(a, 4, 1 << 20, s_));
  ASSERT_CU(cuMemFreeAsync(a, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuGraphExecDestroy(eb));
  ASSERT_CU(cuGraphDestroy(gb));
  ASSERT_CU(cuGraphExecDestroy(ea));
  ASSERT_CU(cuGraphDestroy(ga));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
}

// Work captured into one graph on the memory another graph allocates runs at its own launch, which
// the program orders after the allocating graph's: accepted at capture, as an explicit node is.
TEST_F(Capture, CapturedWorkMayUseAnotherGraphsMemory) {
  CUdeviceptr a = 0;
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemAllocAsync(&a, 4096, s_));
  CUgraph ga = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &ga));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD8Async(a, 9, 4096, s_));  // a does not exist until ga launches
  CUgraph gb = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &gb));
  CUgraphExec ea = nullptr, eb = nullptr;
  ASSERT_CU(cuGraphInstantiate(&ea, ga, 0));
  ASSERT_CU(cuGraphInstantiate(&eb, gb, 0));
  ASSERT_CU(cuGraphLaunch(ea, s_));
  ASSERT_CU(cuGraphLaunch(eb, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, a, 1));
  EXPECT_EQ(b, 9);
  ASSERT_CU(cuMemFreeAsync(a, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuGraphExecDestroy(eb));
  ASSERT_CU(cuGraphExecDestroy(ea));
  ASSERT_CU(cuGraphDestroy(gb));
  ASSERT_CU(cuGraphDestroy(ga));
}

TEST_F(Capture, DestroyingACapturingStreamAbandonsTheCapture) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  CUstream doomed = nullptr;
  ASSERT_CU(cuStreamCreate(&doomed, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamBeginCapture(doomed, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr graph_mem = 0;
  ASSERT_CU(cuMemAllocAsync(&graph_mem, 4096, doomed));
  ASSERT_CU(cuMemsetD8Async(buf_, 1, kBytes, doomed));
  ASSERT_CU(cuStreamDestroy(doomed));
  ASSERT_CU(cuCtxSynchronize());  // no capture in progress any more
  EXPECT_EQ(At(0), 0);
  // No graph, so no launch: the captured allocation never existed and cannot be freed.
  EXPECT_EQ(cuMemFree(graph_mem), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
}

TEST_F(Capture, MemAllocNodeReservesGraphMemoryUntilTheProgramFreesIt) {
  CUgraph g = nullptr;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode node = nullptr;
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  EXPECT_EQ(cuGraphAddMemAllocNode(&node, g, nullptr, 0, &params), CUDA_ERROR_INVALID_VALUE);  // no size, no location
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = 0;
  params.bytesize = 1000;
  EXPECT_DEATH(cuGraphAddMemAllocNode(&node, nullptr, nullptr, 0, &params),
               "fakecuda: misuse: cuGraphAddMemAllocNode: graph 0 was never created");
  const size_t before = fakecudaDeviceUsedBytes(0);
  const unsigned long long calls = fakecudaDriverAllocCount();
  ASSERT_CU(cuGraphAddMemAllocNode(&node, g, nullptr, 0, &params));
  EXPECT_NE(node, nullptr);
  ASSERT_NE(params.dptr, 0u);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before + 1024);  // charged, rounded to 512 bytes
  EXPECT_EQ(fakecudaDriverAllocCount(), calls + 1);
  // Not the program's before a launch allocates it (H200 and H100 refuse the free, 2026-11-26).
  EXPECT_EQ(cuMemFreeAsync(params.dptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemsetD8(params.dptr, 7, 1000));  // device memory from now on
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(params.dptr)[999], 7);
  // Not freed inside the graph: destroying the graph leaves it to the program.
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  EXPECT_DEATH(cuGraphDestroy(g), "fakecuda: misuse: cuGraphDestroy: graph 0x[0-9a-f]+ was destroyed \\(cuGraphDestroy\\)");
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before + 1024);
  ASSERT_CU(cuMemFree(params.dptr));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);
}

// Graph memory across launches (cuGraphLaunch, cuGraphInstantiate, cuGraphAddMemAllocNode): "The
// allocation's address remains fixed across instantiations and launches"; a launch while the
// previous launch's allocations are unfreed fails with CUDA_ERROR_INVALID_VALUE unless the graph
// was instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH; a graph with memory
// nodes has one executable graph at a time. The simulated device gave a freed graph allocation
// back for good, so a relaunch's memory was "no allocation" and a legal copy stopped the process,
// and it let a relaunch over unfreed memory and a second instantiation through (a review
// helper's reproducers).
TEST_F(Capture, GraphMemoryIsMadeAgainAtItsAddressByEachLaunch) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemAllocAsync(&p, 4096, s_));
  ASSERT_CU(cuMemsetD8Async(p, 5, 4096, s_));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  const size_t used = fakecudaDeviceUsedBytes(0);
  CUgraphExec exec = nullptr, second = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  EXPECT_EQ(cuGraphInstantiate(&second, g, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAddressRange(&base, &size, p));
  unsigned long long first_id = 0, again_id = 0;
  ASSERT_CU(cuPointerGetAttribute(&first_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  // Unfreed: the next launch is refused.
  EXPECT_EQ(cuGraphLaunch(exec, s_), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFreeAsync(p, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);  // the graph keeps the address (and the memory)
  // Freed: the next launch makes it again, at the same address, and the program may use it.
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, p, 1));
  EXPECT_EQ(b, 5);
  ASSERT_CU(cuPointerGetAttribute(&again_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  EXPECT_NE(again_id, first_id);  // another allocation at the same address
  ASSERT_CU(cuMemFree(p));  // cuMemFree too leaves it to the graph
  ASSERT_CU(cuGraphExecDestroy(exec));
  // Instantiated to free on launch: a relaunch over unfreed memory frees it first.
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuMemFreeAsync(p, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));  // and the memory goes back with the graph
  EXPECT_LT(fakecudaDeviceUsedBytes(0), used);
}

}  // namespace
}  // namespace fakecuda_test
