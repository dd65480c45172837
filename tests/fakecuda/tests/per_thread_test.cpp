// Code built with --default-stream per-thread (CUDA_API_PER_THREAD_DEFAULT_STREAM): the headers
// turn cudaMemsetAsync into cudaMemsetAsync_ptsz, cuStreamQuery into cuStreamQuery_ptsz, etc.,
// and stream 0 then means the calling thread's own default stream. This file is compiled that way.
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1

#include <dlfcn.h>

#include <thread>

#include "test_util.h"

namespace fakecuda_test {
namespace {

using PerThreadDriver = DriverTest;

TEST_F(PerThreadDriver, StreamZeroIsTheThreadsOwnBlockingStream) {
  constexpr size_t n = 4096;
  CUdeviceptr buf = 0, other = 0;
  ASSERT_CU(cuMemAlloc(&buf, n));
  ASSERT_CU(cuMemAlloc(&other, n));
  ASSERT_CU(fakecuLaunchDelayedFill_ptsz(buf, 1, n, kDelayUs, nullptr));
  EXPECT_EQ(cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);       // cuStreamQuery_ptsz
  EXPECT_EQ(cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);       // the legacy stream is idle
  // Another thread's per-thread stream does not wait for ours.
  std::thread([&] {
    cuCtxSetCurrent(ctx_);
    ASSERT_CU(cuMemsetD8Async(other, 9, n, nullptr));
    const auto start = std::chrono::steady_clock::now();
    ASSERT_CU(cuStreamSynchronize(nullptr));
    EXPECT_LT(Seconds(start), 0.15);
  }).join();
  EXPECT_EQ(reinterpret_cast<unsigned char*>(other)[100], 9);
  // But it is a blocking stream: legacy-stream work waits for it.
  ASSERT_CU(cuMemsetD8Async(buf, 2, n, CU_STREAM_LEGACY));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_LEGACY));
  EXPECT_EQ(reinterpret_cast<unsigned char*>(buf)[n - 1], 2);
  // Synchronous copies (cuMemcpyHtoD_v2_ptds) are ordered on the per-thread stream.
  ASSERT_CU(fakecuLaunchDelayedFill_ptsz(buf, 3, n, kDelayUs / 4, nullptr));
  unsigned char byte = 0;
  ASSERT_CU(cuMemcpyDtoH(&byte, buf + 7, 1));
  EXPECT_EQ(byte, 3);
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuMemFree(other));
}

using PerThreadRuntime = RuntimeTest;

TEST_F(PerThreadRuntime, PtszAndPtdsEntryPoints) {
  unsigned char* p = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&p), 4096));
  ASSERT_EQ(fakecudaLaunchDelayedFill(p, 1, 4096, kDelayUs, cudaStreamPerThread), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);  // cudaStreamQuery_ptsz: 0 is per-thread
  EXPECT_EQ(cudaStreamQuery(cudaStreamLegacy), cudaSuccess);
  ASSERT_RT(cudaMemsetAsync(p, 2, 4096, nullptr));  // cudaMemsetAsync_ptsz, after the fill
  ASSERT_RT(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(p[4095], 2);
  std::vector<unsigned char> out(4096);
  ASSERT_RT(cudaMemcpy(out.data(), p, 4096, cudaMemcpyDeviceToHost));  // cudaMemcpy_ptds
  EXPECT_EQ(out[0], 2);
  ASSERT_RT(cudaMemset(p, 3, 4096));  // cudaMemset_ptds
  EXPECT_EQ(p[0], 3);
  cudaEvent_t e;
  ASSERT_RT(cudaEventCreate(&e));
  ASSERT_RT(cudaEventRecord(e, nullptr));  // cudaEventRecord_ptsz
  ASSERT_RT(cudaEventSynchronize(e));
  ASSERT_RT(cudaEventDestroy(e));
  ASSERT_RT(cudaFree(p));
}

TEST_F(PerThreadRuntime, StreamOrderedAllocationReachesTheDriver) {
  const auto allocs = fakecudaDriverAllocCount();
  const auto frees = fakecudaDriverFreeCount();
  cudaMemPool_t pool = nullptr;
  ASSERT_RT(cudaDeviceGetDefaultMemPool(&pool, 0));
  void *a = nullptr, *b = nullptr;
  ASSERT_RT(cudaMallocAsync(&a, 1000, nullptr));                // cudaMallocAsync_ptsz
  ASSERT_RT(cudaMallocFromPoolAsync(&b, 1000, pool, nullptr));  // cudaMallocFromPoolAsync_ptsz
  EXPECT_EQ(fakecudaDriverAllocCount() - allocs, 2u);
  ASSERT_RT(cudaFreeAsync(a, nullptr));  // cudaFreeAsync_ptsz
  ASSERT_RT(cudaFreeAsync(b, nullptr));
  ASSERT_RT(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(fakecudaDriverFreeCount() - frees, 2u);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(PerThreadRuntime, DriverEntryPointsDefaultToPerThreadVariants) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
  ASSERT_RT(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnableDefault, &st));  // ..._ptsz
  EXPECT_EQ(SymbolOf(fn), "cuMemAllocAsync_ptsz");
  EXPECT_EQ(st, cudaDriverEntryPointSuccess);
  ASSERT_RT(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnableLegacyStream, &st));
  EXPECT_EQ(SymbolOf(fn), "cuMemAllocAsync");
  ASSERT_RT(cudaGetDriverEntryPointByVersion("cuMemFreeAsync", &fn, 12000, cudaEnableDefault, &st));
  EXPECT_EQ(SymbolOf(fn), "cuMemFreeAsync_ptsz");
}
#pragma GCC diagnostic pop

TEST(PerThreadExports, RealNamesAreExported) {
  for (const char* name : {"cudaMallocAsync_ptsz", "cudaFreeAsync_ptsz", "cudaMallocFromPoolAsync_ptsz",
                           "cudaMemcpyAsync_ptsz", "cudaMemsetAsync_ptsz", "cudaMemcpy_ptds", "cudaMemset_ptds",
                           "cudaStreamSynchronize_ptsz", "cudaStreamQuery_ptsz", "cudaStreamWaitEvent_ptsz",
                           "cudaStreamBeginCapture_ptsz", "cudaStreamEndCapture_ptsz", "cudaStreamIsCapturing_ptsz",
                           "cudaEventRecord_ptsz", "cudaGetDriverEntryPoint_ptsz",
                           "cudaGetDriverEntryPointByVersion_ptsz", "cudaGraphLaunch_ptsz"}) {
    EXPECT_NE(dlsym(RTLD_DEFAULT, name), nullptr) << name;
  }
}

}  // namespace
}  // namespace fakecuda_test
