// Driver API: initialization, devices, contexts, allocation, capacity, pointer queries.
#include <cstring>
#include <thread>

#include "test_util.h"

namespace fakecuda_test {
namespace {

TEST(DriverInit, VersionAndInit) {
  int version = 0;
  ASSERT_CU(cuDriverGetVersion(&version));
  EXPECT_EQ(version, 13000);
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuInit(0));
  int count = 0;
  ASSERT_CU(cuDeviceGetCount(&count));
  EXPECT_EQ(count, 1);
}

TEST(DriverInit, DeviceQueries) {
  ASSERT_CU(cuInit(0));
  CUdevice dev = -1;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
  char name[128] = {};
  ASSERT_CU(cuDeviceGetName(name, sizeof(name), 0));
  EXPECT_NE(std::strlen(name), 0u);
  size_t total = 0;
  ASSERT_CU(cuDeviceTotalMem(&total, 0));
  EXPECT_EQ(total, size_t{16} << 30);
  int value = 0;
  ASSERT_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
  EXPECT_EQ(value, 1);
  ASSERT_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(value, 1);
  ASSERT_CU(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  EXPECT_GE(value, 7);
  EXPECT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST(DriverErrors, NamesAndStrings) {
  const char* s = nullptr;
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  ASSERT_CU(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ(s, "out of memory");
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(12345), &s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s, nullptr);
}

TEST(DriverContext, CallsNeedInitAndContext) {
  ASSERT_CU(cuInit(0));
  // A thread with no current context.
  std::thread([] {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, 1024), CUDA_ERROR_INVALID_CONTEXT);
    size_t f = 0, t = 0;
    EXPECT_EQ(cuMemGetInfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext cur = reinterpret_cast<CUcontext>(0x1);
    ASSERT_CU(cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, nullptr);
  }).join();
}

TEST(DriverContext, PrimaryContextLifecycle) {
  InFreshProcess([] {
    ASSERT_CU(cuInit(0));
    unsigned flags = 0;
    int active = -1;
    CUcontext a = nullptr, b = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&b, 0));
    EXPECT_EQ(a, b);
    ASSERT_CU(cuDevicePrimaryCtxRelease(0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 1);
    ASSERT_CU(cuCtxSetCurrent(a));
    CUdevice dev = -1;
    ASSERT_CU(cuCtxGetDevice(&dev));
    EXPECT_EQ(dev, 0);
    CUdeviceptr p = 0;
    ASSERT_CU(cuMemAlloc(&p, 4096));
    const size_t used_before_reset = fakecudaDeviceUsedBytes(0);
    EXPECT_GE(used_before_reset, 4096u);
    // Reset frees everything the context owned and leaves it inactive but current.
    ASSERT_CU(cuDevicePrimaryCtxReset(0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 0);
    EXPECT_LE(fakecudaDeviceUsedBytes(0), used_before_reset - 4096);
    EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    // Retaining again revives it (this retain is kept: see DriverTest).
    ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 1);
    ASSERT_CU(cuMemAlloc(&p, 4096));
    ASSERT_CU(cuMemFree(p));
    // The reset released nothing: the retain from before it is still to be given back.
    ASSERT_CU(cuDevicePrimaryCtxRelease(0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 1);
    // Releasing the last retain destroys the context like a reset.
    ASSERT_CU(cuDevicePrimaryCtxRelease(0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 0);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
    ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));
  });
}

// "Resetting the primary context does not release it, an application that has retained the
// primary context should explicitly release its usage", and "it is safe for other modules to call
// cuDevicePrimaryCtxRelease() even after resetting the device" (cuDevicePrimaryCtxReset). The
// reset dropped every retain, so that a module's release after it failed with
// CUDA_ERROR_INVALID_CONTEXT.
TEST(DriverContext, AResetKeepsTheRetainsItsUsersRelease) {
  InFreshProcess([] {
    ASSERT_CU(cuInit(0));
    CUcontext a = nullptr;
    unsigned flags = 0;
    int active = -1;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));
    ASSERT_CU(cuDevicePrimaryCtxReset(0));
    ASSERT_CU(cuDevicePrimaryCtxRelease(0));  // an inactive context: nothing more to destroy
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 0);
    ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));  // active again, with two retains
    ASSERT_CU(cuDevicePrimaryCtxRelease(0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 1);
    ASSERT_CU(cuDevicePrimaryCtxRelease(0));
    ASSERT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT_EQ(active, 0);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  });
}

TEST(DriverContext, PushPop) {
  ASSERT_CU(cuInit(0));
  CUcontext ctx = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  std::thread([ctx] {  // a thread with an empty context stack
    CUcontext popped = nullptr, cur = nullptr;
    ASSERT_CU(cuCtxPushCurrent(ctx));
    ASSERT_CU(cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, ctx);
    ASSERT_CU(cuCtxPushCurrent(ctx));
    ASSERT_CU(cuCtxPopCurrent(&popped));
    EXPECT_EQ(popped, ctx);
    ASSERT_CU(cuCtxPopCurrent(&popped));
    ASSERT_CU(cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, nullptr);
    EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_DEATH(cuCtxPushCurrent(reinterpret_cast<CUcontext>(0x1234)),
                 "^fakecuda: misuse: cuCtxPushCurrent_v2: context 0x1234 was never created\n$");
    // cuCtxSetCurrent replaces the top of the stack; NULL unbinds.
    ASSERT_CU(cuCtxSetCurrent(ctx));
    ASSERT_CU(cuCtxSetCurrent(nullptr));
    ASSERT_CU(cuCtxGetCurrent(&cur));
    EXPECT_EQ(cur, nullptr);
  }).join();
}

using DriverMemory = DriverTest;

TEST_F(DriverMemory, AllocWriteReadFree) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 1 << 20));
  EXPECT_EQ(p % 512, 0u);
  std::vector<unsigned char> in(1 << 20), out(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7);
  ASSERT_CU(cuMemcpyHtoD(p, in.data(), in.size()));
  // Device memory is directly dereferenceable by the host in the fake.
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[12345], in[12345]);
  ASSERT_CU(cuMemcpyDtoH(out.data(), p, out.size()));
  EXPECT_EQ(in, out);
  CUdeviceptr q = 0;
  ASSERT_CU(cuMemAlloc(&q, 1 << 20));
  ASSERT_CU(cuMemcpyDtoD(q, p, 1 << 20));
  ASSERT_CU(cuMemsetD8(p, 0xAB, 1 << 20));
  ASSERT_CU(cuMemcpyDtoH(out.data(), q, out.size()));
  EXPECT_EQ(in, out);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[999], 0xAB);
  ASSERT_CU(cuMemsetD32(q, 0x01020304u, 16));
  EXPECT_EQ(reinterpret_cast<unsigned*>(q)[15], 0x01020304u);
  EXPECT_EQ(cuMemsetD32(q + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);  // misaligned
  ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuMemFree(q));
}

TEST_F(DriverMemory, AlignmentAndDistinctRanges) {
  std::vector<CUdeviceptr> ptrs;
  for (size_t size : {1, 100, 511, 512, 513, 4096, 100000}) {
    CUdeviceptr p = 0;
    ASSERT_CU(cuMemAlloc(&p, size));
    EXPECT_EQ(p % 512, 0u) << size;
    for (CUdeviceptr other : ptrs) EXPECT_NE(p, other);
    ptrs.push_back(p);
  }
  for (CUdeviceptr p : ptrs) ASSERT_CU(cuMemFree(p));
}

TEST_F(DriverMemory, InvalidArguments) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cuMemFree(0));  // a no-op, as cudaFree(nullptr) (an H200, 2026-11-27)
  ASSERT_CU(cuMemAlloc(&p, 4096));
  EXPECT_EQ(cuMemFree(p + 512), CUDA_ERROR_INVALID_VALUE);  // not the base
  ASSERT_CU(cuMemFree(p));
  EXPECT_EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);  // double free
  int local = 0;
  EXPECT_EQ(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(&local), &local, sizeof(local)), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(DriverMemory, CapacityAndMemGetInfo) {
  size_t free0 = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free0, &total));
  EXPECT_EQ(total, size_t{16} << 30);
  EXPECT_EQ(free0, total - fakecudaDeviceUsedBytes(0));
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 1000));
  size_t free1 = 0;
  ASSERT_CU(cuMemGetInfo(&free1, nullptr));  // null outputs are allowed
  EXPECT_EQ(free0 - free1, 1024u);           // rounded to 512 bytes
  // More than is left: out of memory, and nothing changes.
  CUdeviceptr big = 0;
  EXPECT_EQ(cuMemAlloc(&big, free1 + 1), CUDA_ERROR_OUT_OF_MEMORY);
  size_t free2 = 0;
  ASSERT_CU(cuMemGetInfo(&free2, &total));
  EXPECT_EQ(free2, free1);
  ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuMemGetInfo(&free2, &total));
  EXPECT_EQ(free2, free0);
}

TEST_F(DriverMemory, LargeAllocationsAreLazilyBacked) {
  // 12 GiB of a 16 GiB device: only touched pages cost RAM.
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, size_t{12} << 30));
  reinterpret_cast<char*>(p)[0] = 1;
  reinterpret_cast<char*>(p)[(size_t{12} << 30) - 1] = 2;
  CUdeviceptr q = 0;
  EXPECT_EQ(cuMemAlloc(&q, size_t{5} << 30), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuMemAlloc(&q, size_t{5} << 30));
  ASSERT_CU(cuMemFree(q));
}

TEST_F(DriverMemory, AllocCountersSeeEveryDeviceAllocationCall) {
  const auto allocs = fakecudaDriverAllocCount();
  const auto frees = fakecudaDriverFreeCount();
  CUdeviceptr a = 0, b = 0, c = 0;
  size_t pitch = 0;
  ASSERT_CU(cuMemAlloc(&a, 100));
  ASSERT_CU(cuMemAllocPitch(&b, &pitch, 1000, 10, 4));
  EXPECT_EQ(pitch, 1024u);
  ASSERT_CU(cuMemAllocManaged(&c, 100, CU_MEM_ATTACH_GLOBAL));
  void* host = nullptr;
  ASSERT_CU(cuMemAllocHost(&host, 100));  // pinned host memory is not device memory
  EXPECT_EQ(fakecudaDriverAllocCount() - allocs, 3u);
  EXPECT_EQ(cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);  // rejected calls are not counted
  EXPECT_EQ(fakecudaDriverAllocCount() - allocs, 3u);
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
  ASSERT_CU(cuMemFree(c));
  ASSERT_CU(cuMemFreeHost(host));
  EXPECT_EQ(fakecudaDriverFreeCount() - frees, 3u);
}

TEST_F(DriverMemory, ManagedAndPinnedDoNotCountAgainstCapacity) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  CUdeviceptr m = 0;
  ASSERT_CU(cuMemAllocManaged(&m, size_t{1} << 30, CU_MEM_ATTACH_GLOBAL));
  void* h = nullptr;
  ASSERT_CU(cuMemHostAlloc(&h, size_t{1} << 20, CU_MEMHOSTALLOC_PORTABLE));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
  reinterpret_cast<int*>(m)[5] = 5;
  static_cast<int*>(h)[5] = 6;
  CUdeviceptr dp = 0;
  ASSERT_CU(cuMemHostGetDevicePointer(&dp, h, 0));
  EXPECT_EQ(dp, reinterpret_cast<CUdeviceptr>(h));
  EXPECT_EQ(cuMemAllocManaged(&m, 16, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFree(m));
  EXPECT_EQ(cuMemFreeHost(reinterpret_cast<void*>(m)), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFreeHost(h));
}

TEST_F(DriverMemory, AddressRangeDescribesTheWholeAllocation) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 10000));
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAddressRange(&base, &size, p + 5000));
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 10000u);
  ASSERT_CU(cuMemGetAddressRange(nullptr, &size, p + 9999));
  EXPECT_EQ(size, 10000u);
  int local = 0;
  EXPECT_EQ(cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(&local)), CUDA_ERROR_NOT_FOUND);
  ASSERT_CU(cuMemFree(p));
  EXPECT_EQ(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
}

TEST_F(DriverMemory, PointerAttributes) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 8192));
  CUdeviceptr start = 0;
  size_t range = 0;
  unsigned int type = 0, managed = 7, ipc = 0;
  int ordinal = -1;
  CUcontext ctx = nullptr;
  unsigned long long id1 = 0, id2 = 0;
  const CUdeviceptr inner = p + 4096;
  ASSERT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inner));
  ASSERT_CU(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inner));
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inner));
  ASSERT_CU(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, inner));
  ASSERT_CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inner));
  ASSERT_CU(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, inner));
  ASSERT_CU(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, inner));
  ASSERT_CU(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  EXPECT_EQ(start, p);
  EXPECT_EQ(range, 8192u);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(managed, 0u);
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(ctx, ctx_);
  EXPECT_EQ(ipc, 1u);
  void* host = nullptr;
  EXPECT_EQ(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, p), CUDA_ERROR_INVALID_VALUE);

  // Several at once; unknown pointers are not an error there.
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER};
  void* data[] = {&type, &start, &host};
  ASSERT_CU(cuPointerGetAttributes(3, attrs, data, inner));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(start, p);
  EXPECT_EQ(host, nullptr);
  int local = 0;
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(&local)),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuPointerGetAttributes(3, attrs, data, reinterpret_cast<CUdeviceptr>(&local)));
  EXPECT_EQ(type, 0u);

  // A reallocation at the same address is a different buffer.
  ASSERT_CU(cuMemFree(p));
  CUdeviceptr q = 0;
  ASSERT_CU(cuMemAlloc(&q, 8192));
  ASSERT_CU(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  EXPECT_NE(id1, id2);

  void* pinned = nullptr;
  ASSERT_CU(cuMemAllocHost(&pinned, 64));
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(pinned)));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  ASSERT_CU(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, reinterpret_cast<CUdeviceptr>(pinned)));
  EXPECT_EQ(host, pinned);
  CUdeviceptr m = 0;
  ASSERT_CU(cuMemAllocManaged(&m, 64, CU_MEM_ATTACH_GLOBAL));
  ASSERT_CU(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m));
  EXPECT_EQ(managed, 1u);
  ASSERT_CU(cuMemFree(q));
  ASSERT_CU(cuMemFree(m));
  ASSERT_CU(cuMemFreeHost(pinned));
}

TEST_F(DriverMemory, ConcurrentAllocFreeFromManyThreads) {
  const size_t used = fakecudaDeviceUsedBytes(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      cuCtxSetCurrent(ctx_);
      for (int i = 0; i < 200; ++i) {
        CUdeviceptr p = 0;
        ASSERT_CU(cuMemAlloc(&p, 512 * (1 + (i + t) % 7)));
        reinterpret_cast<char*>(p)[0] = static_cast<char>(t);
        ASSERT_CU(cuMemFree(p));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), used);
}

// CUDA arrays (driver/arrays.cpp): device memory behind a handle, charged to the device like any
// allocation, and given back by the destroy. Only a deferred-mapping array, which takes no memory
// when made, has memory requirements to ask (as CUDA documents).
TEST_F(DriverMemory, ArraysChargeTheDeviceUntilDestroyed) {
  const size_t before = fakecudaDeviceUsedBytes(0);
  CUDA_ARRAY_DESCRIPTOR d{1000, 300, CU_AD_FORMAT_FLOAT, 4};  // width, height, format, channels
  CUarray a = nullptr;
  ASSERT_CU(cuArrayCreate(&a, &d));
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  EXPECT_EQ(cuArrayGetMemoryRequirements(&req, a, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before + 300u * 16384);  // 16,000-byte rows padded to 512
  CUDA_ARRAY_DESCRIPTOR back{};
  ASSERT_CU(cuArrayGetDescriptor(&back, a));
  EXPECT_EQ(back.Width, 1000u);
  EXPECT_EQ(back.Height, 300u);
  EXPECT_EQ(back.NumChannels, 4u);
  // A thread with no current context destroys it (the array knows its context), as an H200 did.
  CUresult no_context = CUDA_ERROR_UNKNOWN;
  std::thread([&] { no_context = cuArrayDestroy(a); }).join();
  EXPECT_EQ(no_context, CUDA_SUCCESS);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);

  CUDA_ARRAY3D_DESCRIPTOR deferred{1000, 300, 0, CU_AD_FORMAT_FLOAT, 4, CUDA_ARRAY3D_DEFERRED_MAPPING};
  ASSERT_CU(cuArray3DCreate(&a, &deferred));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);  // no memory until mapped
  ASSERT_CU(cuArrayGetMemoryRequirements(&req, a, 0));
  EXPECT_EQ(req.size, 300u * 16384);
  EXPECT_EQ(cuArrayGetMemoryRequirements(&req, a, 1), CUDA_ERROR_INVALID_VALUE);  // another device's
  ASSERT_CU(cuArrayDestroy(a));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);

  // A mipmapped array holds every level: more than its first level alone.
  CUDA_ARRAY3D_DESCRIPTOR d3{512, 512, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};  // width, height, depth, format, channels, flags
  CUmipmappedArray m = nullptr;
  ASSERT_CU(cuMipmappedArrayCreate(&m, &d3, 4));
  EXPECT_EQ(cuMipmappedArrayGetMemoryRequirements(&req, m, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before + 512u * 512 + 256 * 512 + 512 * 128 + 512 * 64);  // rows padded
  EXPECT_EQ(cuMipmappedArrayCreate(&m, &d3, 11), CUDA_ERROR_INVALID_VALUE);  // 512 x 512 has 10 levels
  ASSERT_CU(cuMipmappedArrayDestroy(m));

  // What the fake does not simulate is refused, never accepted loosely.
  d.Format = CU_AD_FORMAT_NV12;
  EXPECT_EQ(cuArrayCreate(&a, &d), CUDA_ERROR_INVALID_VALUE);
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 3;
  EXPECT_EQ(cuArrayCreate(&a, &d), CUDA_ERROR_INVALID_VALUE);
  d.NumChannels = 1;
  d.Width = 0;
  EXPECT_EQ(cuArrayCreate(&a, &d), CUDA_ERROR_INVALID_VALUE);

  // The context's arrays go with it.
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  d.Width = 4096;
  ASSERT_CU(cuArrayCreate(&a, &d));
  EXPECT_GT(fakecudaDeviceUsedBytes(0), before);
  ASSERT_CU(cuCtxDestroy(c));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), before);
}

}  // namespace
}  // namespace fakecuda_test
