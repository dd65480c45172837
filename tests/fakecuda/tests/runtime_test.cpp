// Runtime API (fake libcudart.so.13): every call goes through the driver, errors map like CUDA,
// per-thread device and last-error state.
#include <cstring>
#include <thread>

#include "test_util.h"

namespace fakecuda_test {
namespace {

TEST_F(RuntimeTest, VersionsAndDevices) {
  int v = 0;
  ASSERT_RT(cudaRuntimeGetVersion(&v));
  EXPECT_EQ(v, 13000);
  ASSERT_RT(cudaDriverGetVersion(&v));
  EXPECT_EQ(v, 13000);
  int count = 0;
  ASSERT_RT(cudaGetDeviceCount(&count));
  EXPECT_EQ(count, 1);
  int dev = -1;
  ASSERT_RT(cudaGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  cudaDeviceProp prop{};
  ASSERT_RT(cudaGetDeviceProperties(&prop, 0));
  EXPECT_EQ(prop.totalGlobalMem, size_t{16} << 30);
  EXPECT_GT(std::strlen(prop.name), 0u);
  EXPECT_EQ(prop.unifiedAddressing, 1);
  int attr = 0;
  ASSERT_RT(cudaDeviceGetAttribute(&attr, cudaDevAttrMemoryPoolsSupported, 0));
  EXPECT_EQ(attr, 1);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

TEST_F(RuntimeTest, CopiesInEveryDirection) {
  constexpr size_t n = 1 << 16;
  std::vector<unsigned char> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<unsigned char>(i * 13);
  void *a = nullptr, *b = nullptr;
  ASSERT_RT(cudaMalloc(&a, n));
  ASSERT_RT(cudaMalloc(&b, n));
  ASSERT_RT(cudaMemcpy(a, in.data(), n, cudaMemcpyHostToDevice));
  ASSERT_RT(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  ASSERT_RT(cudaMemcpy(out.data(), b, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(in, out);
  ASSERT_RT(cudaMemset(a, 0x7f, n));
  ASSERT_RT(cudaMemcpy(out.data(), a, n, cudaMemcpyDefault));
  EXPECT_EQ(out[n - 1], 0x7f);
  std::vector<unsigned char> host2(n);
  ASSERT_RT(cudaMemcpy(host2.data(), in.data(), n, cudaMemcpyHostToHost));
  EXPECT_EQ(host2, in);
  EXPECT_EQ(cudaMemcpy(out.data(), a, n, static_cast<cudaMemcpyKind>(17)), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  ASSERT_RT(cudaMemcpyAsync(b, in.data(), n, cudaMemcpyHostToDevice, s));
  ASSERT_RT(cudaMemsetAsync(a, 1, n, s));
  ASSERT_RT(cudaMemcpyAsync(out.data(), b, n, cudaMemcpyDefault, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(out, in);
  ASSERT_RT(cudaStreamDestroy(s));
  ASSERT_RT(cudaFree(a));
  ASSERT_RT(cudaFree(b));
}

TEST_F(RuntimeTest, ErrorsMapAndStickPerThread) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, size_t{64} << 30), cudaErrorMemoryAllocation);  // CUDA_ERROR_OUT_OF_MEMORY
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  std::thread([] {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // last error is per thread
    EXPECT_EQ(cudaFree(reinterpret_cast<void*>(0x10)), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  }).join();
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // A success does not clear an earlier error.
  EXPECT_EQ(cudaFree(reinterpret_cast<void*>(0x20)), cudaErrorInvalidValue);
  ASSERT_RT(cudaMalloc(&p, 16));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_RT(cudaFree(p));
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorStreamCaptureInvalidated), "cudaErrorStreamCaptureInvalidated");
  EXPECT_STREQ(cudaGetErrorString(static_cast<cudaError_t>(4242)), "unrecognized error code");
}

TEST_F(RuntimeTest, ZeroSizeAndNullPointers) {
  const auto allocs = fakecudaDriverAllocCount();
  void* p = reinterpret_cast<void*>(0x1);
  ASSERT_RT(cudaMalloc(&p, 0));
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(fakecudaDriverAllocCount(), allocs);  // never reached the driver
  ASSERT_RT(cudaFree(nullptr));
  ASSERT_RT(cudaFreeHost(nullptr));
  EXPECT_EQ(cudaMalloc(nullptr, 16), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_F(RuntimeTest, EveryAllocationReachesTheDriver) {
  const auto allocs = fakecudaDriverAllocCount();
  const auto frees = fakecudaDriverFreeCount();
  cudaMemPool_t pool = nullptr;
  ASSERT_RT(cudaDeviceGetDefaultMemPool(&pool, 0));
  void *a, *b, *c, *d, *f, *host1, *host2;
  size_t pitch = 0;
  ASSERT_RT(cudaMalloc(&a, 1000));
  ASSERT_RT(cudaMallocPitch(&b, &pitch, 1000, 3));
  EXPECT_GE(pitch, 1000u);
  ASSERT_RT(cudaMallocManaged(&c, 1000));
  ASSERT_RT(cudaMallocAsync(&d, 1000, nullptr));
  ASSERT_RT(cudaMallocFromPoolAsync(&f, 1000, pool, nullptr));
  ASSERT_RT(cudaMallocHost(&host1, 1000));
  ASSERT_RT(cudaHostAlloc(&host2, 1000, cudaHostAllocPortable));
  EXPECT_EQ(fakecudaDriverAllocCount() - allocs, 5u);
  void* mapped = nullptr;
  ASSERT_RT(cudaHostGetDevicePointer(&mapped, host1, 0));
  EXPECT_EQ(mapped, host1);
  ASSERT_RT(cudaFree(a));
  ASSERT_RT(cudaFree(b));
  ASSERT_RT(cudaFree(c));
  ASSERT_RT(cudaFreeAsync(d, nullptr));
  ASSERT_RT(cudaFree(f));  // cudaFree may release stream-ordered memory too
  ASSERT_RT(cudaFreeHost(host1));
  ASSERT_RT(cudaFreeHost(host2));
  EXPECT_EQ(fakecudaDriverFreeCount() - frees, 5u);
}

TEST_F(RuntimeTest, MemGetInfoTracksCapacity) {
  size_t free0 = 0, total = 0, free1 = 0;
  ASSERT_RT(cudaMemGetInfo(&free0, &total));
  EXPECT_EQ(total, size_t{16} << 30);
  EXPECT_EQ(total - free0, fakecudaDeviceUsedBytes(0));
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 10 << 20));
  ASSERT_RT(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0 - free1, size_t{10} << 20);
  ASSERT_RT(cudaFree(p));
}

TEST_F(RuntimeTest, PointerAttributes) {
  void *dev = nullptr, *pinned = nullptr, *managed = nullptr;
  ASSERT_RT(cudaMalloc(&dev, 4096));
  ASSERT_RT(cudaMallocHost(&pinned, 4096));
  ASSERT_RT(cudaMallocManaged(&managed, 4096));
  cudaPointerAttributes attr{};
  ASSERT_RT(cudaPointerGetAttributes(&attr, static_cast<char*>(dev) + 100));
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  EXPECT_EQ(attr.devicePointer, static_cast<char*>(dev) + 100);
  EXPECT_EQ(attr.hostPointer, nullptr);
  ASSERT_RT(cudaPointerGetAttributes(&attr, pinned));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(attr.hostPointer, pinned);
  EXPECT_EQ(attr.devicePointer, pinned);
  ASSERT_RT(cudaPointerGetAttributes(&attr, managed));
  EXPECT_EQ(attr.type, cudaMemoryTypeManaged);
  EXPECT_EQ(attr.hostPointer, managed);
  int local = 0;
  ASSERT_RT(cudaPointerGetAttributes(&attr, &local));  // CUDA >= 11: not an error
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(attr.devicePointer, nullptr);
  ASSERT_RT(cudaFree(dev));
  ASSERT_RT(cudaFreeHost(pinned));
  ASSERT_RT(cudaFree(managed));
}

TEST_F(RuntimeTest, NewThreadsBindThePrimaryContextLazily) {
  CUcontext main_ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&main_ctx));
  ASSERT_NE(main_ctx, nullptr);
  std::thread([&] {
    CUcontext cur = reinterpret_cast<CUcontext>(0x1);
    ASSERT_CU(cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, nullptr);  // nothing until the first runtime call
    void* p = nullptr;
    ASSERT_RT(cudaMalloc(&p, 64));
    ASSERT_CU(cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, main_ctx);  // the same primary context
    ASSERT_RT(cudaFree(p));
  }).join();
}

TEST_F(RuntimeTest, StreamsEventsAndTheDelayedFill) {
  constexpr size_t n = 1 << 16;
  unsigned char* p = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&p), n));
  ASSERT_RT(cudaMemset(p, 0, n));
  cudaStream_t s = nullptr, t = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_RT(cudaStreamCreate(&t));
  cudaEvent_t start, done;
  ASSERT_RT(cudaEventCreate(&start));
  ASSERT_RT(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  ASSERT_RT(cudaEventRecord(start, s));
  ASSERT_EQ(fakecudaLaunchDelayedFill(p, 0x42, n, 150000, s), cudaSuccess);
  ASSERT_RT(cudaEventRecord(done, s));
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // "not ready" is not an error
  ASSERT_RT(cudaStreamWaitEvent(t, done, 0));
  ASSERT_RT(cudaMemsetAsync(p, 0x43, 1, t));
  ASSERT_RT(cudaStreamSynchronize(t));
  EXPECT_EQ(p[0], 0x43);     // ordered after the fill by the event
  EXPECT_EQ(p[n - 1], 0x42);
  cudaEvent_t end;
  ASSERT_RT(cudaEventCreate(&end));
  ASSERT_RT(cudaEventRecord(end, s));
  ASSERT_RT(cudaEventSynchronize(end));
  float ms = 0;
  ASSERT_RT(cudaEventElapsedTime(&ms, start, end));
  EXPECT_GE(ms, 100.0f);
  EXPECT_EQ(fakecudaLaunchDelayedFill(p + n - 8, 0, 64, 0, s), cudaErrorInvalidValue);  // out of bounds
  cudaGetLastError();
  for (cudaEvent_t e : {start, done, end}) ASSERT_RT(cudaEventDestroy(e));
  ASSERT_RT(cudaStreamDestroy(s));
  ASSERT_RT(cudaStreamDestroy(t));
  ASSERT_RT(cudaFree(p));
}

TEST_F(RuntimeTest, StreamCaptureThroughTheRuntime) {
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  unsigned char* p = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&p), 4096));
  ASSERT_RT(cudaMemset(p, 0, 4096));
  ASSERT_RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus st;
  ASSERT_RT(cudaStreamIsCapturing(s, &st));
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  unsigned long long id = 0;
  ASSERT_RT(cudaStreamGetCaptureInfo(s, &st, &id));
  EXPECT_NE(id, 0u);
  void* graph_mem = nullptr;
  ASSERT_RT(cudaMallocAsync(&graph_mem, 1 << 20, s));
  ASSERT_RT(cudaMemsetAsync(p, 5, 4096, s));
  ASSERT_RT(cudaFreeAsync(graph_mem, s));
  cudaGraph_t graph = nullptr;
  ASSERT_RT(cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(p[0], 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_RT(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_RT(cudaGraphLaunch(exec, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(p[0], 5);
  ASSERT_RT(cudaGraphExecDestroy(exec));
  ASSERT_RT(cudaGraphDestroy(graph));

  // A pool that synchronizes during capture breaks it.
  ASSERT_RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  // Relaxed mode allows cudaMalloc (PyTorch relies on that).
  ASSERT_RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  ASSERT_RT(cudaMalloc(&q, 64));
  ASSERT_RT(cudaStreamEndCapture(s, &graph));
  ASSERT_RT(cudaGraphDestroy(graph));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_RT(cudaThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  ASSERT_RT(cudaThreadExchangeStreamCaptureMode(&mode));
  ASSERT_RT(cudaFree(q));
  ASSERT_RT(cudaFree(p));
  ASSERT_RT(cudaStreamDestroy(s));
}

TEST_F(RuntimeTest, HostFunctions) {
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  int called = 0;
  ASSERT_RT(cudaLaunchHostFunc(s, [](void* p) { ++*static_cast<int*>(p); }, &called));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(called, 1);
  ASSERT_RT(cudaStreamDestroy(s));
}

TEST_F(RuntimeTest, MemoryPools) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr, current = nullptr, def = nullptr;
  ASSERT_RT(cudaMemPoolCreate(&pool, &props));
  void* p = nullptr;
  ASSERT_RT(cudaMallocFromPoolAsync(&p, 4096, pool, nullptr));
  CUmemoryPool owner = nullptr;
  ASSERT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, reinterpret_cast<CUdeviceptr>(p)));
  EXPECT_EQ(owner, pool);
  ASSERT_RT(cudaFreeAsync(p, nullptr));
  ASSERT_RT(cudaDeviceGetDefaultMemPool(&def, 0));
  ASSERT_RT(cudaDeviceSetMemPool(0, pool));
  ASSERT_RT(cudaDeviceGetMemPool(&current, 0));
  EXPECT_EQ(current, pool);
  ASSERT_RT(cudaDeviceSetMemPool(0, def));
  ASSERT_RT(cudaMemPoolTrimTo(pool, 0));
  ASSERT_RT(cudaStreamSynchronize(nullptr));
  ASSERT_RT(cudaMemPoolDestroy(pool));
  EXPECT_EQ(cudaMemPoolDestroy(def), cudaErrorInvalidValue);  // the default pool cannot be destroyed
  cudaGetLastError();
}

// The figures CUDA's pools report (what PyTorch's cudaMallocAsync backend reads), and their rules:
// highs reset to the current value by writing 0, current figures read-only, freed memory kept up
// to the release threshold and given back by a trim.
TEST_F(RuntimeTest, MemoryPoolAttributes) {
  cudaMemPool_t def = nullptr;
  ASSERT_RT(cudaDeviceGetDefaultMemPool(&def, 0));
  auto get = [&](cudaMemPoolAttr a) {
    cuuint64_t v = 12345;
    EXPECT_EQ(cudaMemPoolGetAttribute(def, a, &v), cudaSuccess);
    return static_cast<uint64_t>(v);
  };
  EXPECT_EQ(get(cudaMemPoolAttrReleaseThreshold), 0u);  // CUDA's default
  int flag = 0;
  ASSERT_RT(cudaMemPoolGetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &flag));
  EXPECT_EQ(flag, 1);
  flag = 0;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &flag));
  flag = 1;
  ASSERT_RT(cudaMemPoolGetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &flag));
  EXPECT_EQ(flag, 0);

  // Threshold 0: a free gives the memory back.
  void* p = nullptr;
  // Used counts the bytes asked for; reserved grows in 32 MiB chunks (as measured on an H100, and
  // the 134217728 an H200 reported for 120953344 bytes used).
  ASSERT_RT(cudaMallocAsync(&p, 1000, nullptr));
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemCurrent), 1000u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), 32u << 20);
  void* q = nullptr;
  ASSERT_RT(cudaMallocAsync(&q, 120953344, nullptr));
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemCurrent), 120953344u + 1000u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), 128u << 20);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemHigh), 128u << 20);
  ASSERT_RT(cudaFreeAsync(q, nullptr));
  ASSERT_RT(cudaFreeAsync(p, nullptr));
  ASSERT_RT(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemCurrent), 0u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), 0u);
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemHigh), 120953344u + 1000u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemHigh), 128u << 20);

  // Threshold UINT64_MAX (PyTorch's setting): freed memory stays reserved until trimmed.
  cuuint64_t v = UINT64_MAX;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &v));
  EXPECT_EQ(get(cudaMemPoolAttrReleaseThreshold), UINT64_MAX);
  ASSERT_RT(cudaMallocAsync(&p, 1 << 20, nullptr));
  ASSERT_RT(cudaFreeAsync(p, nullptr));
  ASSERT_RT(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemCurrent), 0u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), 32u << 20);

  v = 0;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &v));
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReservedMemHigh, &v));
  EXPECT_EQ(get(cudaMemPoolAttrUsedMemHigh), 0u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemHigh), 32u << 20);
  ASSERT_RT(cudaMemPoolTrimTo(def, 0));
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemCurrent), 0u);
  EXPECT_EQ(get(cudaMemPoolAttrReservedMemHigh), 32u << 20);

  v = 5;
  EXPECT_EQ(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &v), cudaErrorInvalidValue);
  cudaGetLastError();
  v = 0;
  EXPECT_EQ(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &v), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &v));
  flag = 1;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &flag));
}

// The sequence measured on an H100 (2026-11-26): the release threshold is a ceiling on what freed
// memory leaves reserved, cudaMemPoolTrimTo's argument a floor, both in whole 32 MiB chunks.
TEST_F(RuntimeTest, MemoryPoolThresholdAndTrimAsOnAnH100) {
  cudaMemPool_t def = nullptr;
  ASSERT_RT(cudaDeviceGetDefaultMemPool(&def, 0));
  auto reserved = [&] {
    cuuint64_t v = 0;
    EXPECT_EQ(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReservedMemCurrent, &v), cudaSuccess);
    return static_cast<uint64_t>(v);
  };
  auto three_allocations_freed = [&] {
    void* p[3] = {};
    for (void*& q : p) ASSERT_RT(cudaMallocAsync(&q, 40000000, nullptr));
    EXPECT_EQ(reserved(), 128u << 20);
    for (void* q : p) ASSERT_RT(cudaFreeAsync(q, nullptr));
    ASSERT_RT(cudaStreamSynchronize(nullptr));
  };
  cuuint64_t threshold = 40u << 20;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
  three_allocations_freed();
  EXPECT_EQ(reserved(), 32u << 20);
  threshold = UINT64_MAX;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
  three_allocations_freed();
  EXPECT_EQ(reserved(), 128u << 20);
  ASSERT_RT(cudaMemPoolTrimTo(def, 40u << 20));
  EXPECT_EQ(reserved(), 64u << 20);
  ASSERT_RT(cudaMemPoolTrimTo(def, 0));
  EXPECT_EQ(reserved(), 0u);
  threshold = 0;
  ASSERT_RT(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
}

TEST_F(RuntimeTest, DeviceResetFreesEverythingAndRecovers) {
  const size_t baseline_used = fakecudaDeviceUsedBytes(0);
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 1 << 20));
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreate(&s));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), baseline_used + (1 << 20));
  ASSERT_RT(cudaDeviceReset());
  EXPECT_LE(fakecudaDeviceUsedBytes(0), baseline_used);
  // The old stream died with the context: using it is misuse (a real driver would crash).
  EXPECT_DEATH(cudaStreamSynchronize(s),
               "fakecuda: misuse: cuStreamSynchronize: stream 0x[0-9a-f]+ was destroyed \\(cuDevicePrimaryCtxReset_v2\\)");
  // The next call transparently sets up a fresh context.
  ASSERT_RT(cudaMalloc(&p, 1 << 20));
  ASSERT_RT(cudaFree(p));
}

// The runtime's arrays are the driver's (cudaArray_t and CUarray are one type), made and freed
// through it as NVIDIA's runtime does.
TEST_F(RuntimeTest, ArraysGoThroughTheDriver) {
  const size_t before = fakecudaDeviceUsedBytes(0);
  cudaChannelFormatDesc desc = cudaChannelFormatDesc{32, 32, 32, 32, cudaChannelFormatKindFloat};
  cudaArray_t a = nullptr;
  ASSERT_RT(cudaMallocArray(&a, &desc, 1000, 300));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before + 300 * 16384);  // 16,000-byte rows padded to 512
  ASSERT_RT(cudaFreeArray(a));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);
  ASSERT_RT(cudaFreeArray(nullptr));

  cudaMipmappedArray_t m = nullptr;
  desc = cudaChannelFormatDesc{8, 0, 0, 0, cudaChannelFormatKindUnsigned};
  ASSERT_RT(cudaMallocMipmappedArray(&m, &desc, cudaExtent{256, 256, 0}, 3, 0));
  ASSERT_RT(cudaFreeMipmappedArray(m));
  ASSERT_RT(cudaMalloc3DArray(&a, &desc, cudaExtent{64, 64, 8}, cudaArrayLayered));
  ASSERT_RT(cudaFreeArray(a));

  desc = cudaChannelFormatDesc{32, 16, 0, 0, cudaChannelFormatKindFloat};  // channels of two sizes
  EXPECT_EQ(cudaMallocArray(&a, &desc, 16, 16), cudaErrorInvalidChannelDescriptor);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidChannelDescriptor);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);
}

}  // namespace
}  // namespace fakecuda_test
