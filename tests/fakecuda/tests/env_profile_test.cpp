// Tests that need a non-default environment. ctest runs them in their own process with
// FAKECUDA_TEST_PROFILE set and the matching FAKECUDA_* variables (see CMakeLists.txt); anywhere
// else they skip themselves.
#include <cstdlib>
#include <cstring>
#include <thread>

#include "test_util.h"

namespace fakecuda_test {
namespace {

bool Profile(const char* name) {
  const char* p = std::getenv("FAKECUDA_TEST_PROFILE");
  return p != nullptr && std::strcmp(p, name) == 0;
}

constexpr size_t kMiB = size_t{1} << 20;

// FAKECUDA_DEVICES=2 FAKECUDA_MEM=64MiB FAKECUDA_FAIL_ALLOC=2,4 FAKECUDA_CONTEXT_MEM=8MiB
class SmallDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Profile("small")) GTEST_SKIP() << "runs under ctest's fakecuda.profile.small";
  }
};

TEST_F(SmallDevices, FailAllocCapacityContextMemoryAndDeviceSelection) {
  int count = 0;
  ASSERT_RT(cudaGetDeviceCount(&count));
  ASSERT_EQ(count, 2);
  size_t free_b = 0, total = 0;
  ASSERT_RT(cudaMemGetInfo(&free_b, &total));  // creates device 0's context: 8 MiB charged
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free_b, 56 * kMiB);
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), 8 * kMiB);
  EXPECT_EQ(fakecudaDeviceUsedBytes(1), 0u);  // no context there yet

  // FAKECUDA_FAIL_ALLOC=2,4 counts device-memory allocation calls of every kind.
  void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  ASSERT_RT(cudaMalloc(&a, kMiB));                                     // call 1
  EXPECT_EQ(cudaMalloc(&b, kMiB), cudaErrorMemoryAllocation);          // call 2: injected
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_RT(cudaMallocManaged(&b, kMiB));                              // call 3
  EXPECT_EQ(cudaMallocAsync(&c, kMiB, nullptr), cudaErrorMemoryAllocation);  // call 4: injected
  cudaGetLastError();
  ASSERT_RT(cudaMallocAsync(&c, kMiB, nullptr));                       // call 5
  EXPECT_EQ(fakecudaDriverAllocCount(), 5u);
  // Capacity: 56 MiB were free, 2 MiB are now used by a and c (managed memory is not device memory).
  EXPECT_EQ(cudaMalloc(&d, 55 * kMiB), cudaErrorMemoryAllocation);
  cudaGetLastError();
  ASSERT_RT(cudaMalloc(&d, 54 * kMiB));
  ASSERT_RT(cudaMemGetInfo(&free_b, &total));
  EXPECT_EQ(free_b, 0u);

  // Device selection is per thread; device 1 has its own capacity.
  ASSERT_RT(cudaSetDevice(1));
  int dev = -1;
  ASSERT_RT(cudaGetDevice(&dev));
  EXPECT_EQ(dev, 1);
  void* on1 = nullptr;
  ASSERT_RT(cudaMalloc(&on1, 40 * kMiB));
  EXPECT_EQ(fakecudaDeviceUsedBytes(1), 48 * kMiB);  // 8 MiB context + 40 MiB
  cudaPointerAttributes attr{};
  ASSERT_RT(cudaPointerGetAttributes(&attr, on1));
  EXPECT_EQ(attr.device, 1);
  std::thread([] {
    int other = -1;
    ASSERT_RT(cudaGetDevice(&other));
    EXPECT_EQ(other, 0);  // a new thread starts on device 0
    size_t f = 1, t = 0;
    ASSERT_RT(cudaMemGetInfo(&f, &t));
    EXPECT_EQ(f, 0u);  // device 0 is still full
  }).join();
  ASSERT_RT(cudaFree(on1));
  ASSERT_RT(cudaSetDevice(0));
  for (void* p : {a, b, c, d}) ASSERT_RT(cudaFree(p));
  EXPECT_EQ(fakecudaDeviceUsedBytes(0), 8 * kMiB);
}

// "CUDA Runtime API calls operate on the CUDA Driver API CUcontext which is current to the calling
// host thread": cudaGetDevice named the device the thread last selected (0 by default) while a
// context of device 1 was current, so a library choosing its pool by cudaGetDevice (gpushim)
// handed out device 0's memory where CUDA allocates on device 1.
TEST_F(SmallDevices, TheCurrentDeviceIsTheCurrentContexts) {
  CUcontext on1 = nullptr;
  ASSERT_CU(cuInit(0));
  ASSERT_CU(cuCtxCreate(&on1, nullptr, 0, 1));
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  int first = -1, after_switch = -1, after_pop = -1;
  std::thread([&] {
    ASSERT_CU(cuCtxSetCurrent(on1));
    ASSERT_RT(cudaGetDevice(&first));  // the thread's first runtime call
  }).join();
  std::thread([&] {
    ASSERT_RT(cudaFree(nullptr));  // bound to device 0's primary context
    ASSERT_CU(cuCtxPushCurrent(on1));
    ASSERT_RT(cudaGetDevice(&after_switch));
    ASSERT_CU(cuCtxPopCurrent(nullptr));
    ASSERT_RT(cudaGetDevice(&after_pop));
  }).join();
  EXPECT_EQ(first, 1);
  EXPECT_EQ(after_switch, 1);
  EXPECT_EQ(after_pop, 0);
  ASSERT_CU(cuCtxDestroy(on1));
}

}  // namespace
}  // namespace fakecuda_test
