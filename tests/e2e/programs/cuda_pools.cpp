// Memory pools the program creates (runtime and driver API), each keeping what it frees (release
// threshold max): the shim's reserved figure must follow what CUDA's pools reserve through their
// allocations, frees, trims and destruction, and a pool destroyed with an allocation still live
// keeps only that allocation. Prints, after each step, CUDA's reserved bytes over the program's
// pools and the shim's reserved figure, as JSON.
#include <cstdint>
#include <string>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;
std::string g_steps;

uint64_t reserved_of(cudaMemPool_t pool) {
  uint64_t v = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
  return v;
}

// `cuda`: what the program's live pools reserve, plus memory of destroyed pools still live.
void step(const char* name, uint64_t cuda) {
  gpushim_device_stats st = {};
  testsupport::shim_stats(0, &st);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s\"%s\":[%llu,%llu]", g_steps.empty() ? "" : ",", name,
                static_cast<unsigned long long>(cuda), static_cast<unsigned long long>(st.reserved_bytes));
  g_steps += buf;
}

}  // namespace

int main() {
  CHECK(cudaFree(nullptr));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto& drv = testsupport::driver();
  using PoolDestroy = CUresult (*)(CUmemoryPool);
  using PoolTrim = CUresult (*)(CUmemoryPool, size_t);
  using AllocFromPool = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  const auto cu_destroy = testsupport::driver_function<PoolDestroy>("cuMemPoolDestroy");
  const auto cu_trim = testsupport::driver_function<PoolTrim>("cuMemPoolTrimTo");
  const auto cu_alloc = testsupport::driver_function<AllocFromPool>("cuMemAllocFromPoolAsync");

  // A: the runtime's calls.
  cudaMemPool_t a = testsupport::new_keeping_pool(0);
  void* p = nullptr;
  CHECK(cudaMallocFromPoolAsync(&p, 100 * kMiB, a, s));
  step("a_allocated", reserved_of(a));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  step("a_freed", reserved_of(a));
  CHECK(cudaMemPoolTrimTo(a, 0));
  step("a_trimmed", reserved_of(a));
  CHECK(cudaMallocFromPoolAsync(&p, 100 * kMiB, a, s));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  step("a_again", reserved_of(a));

  // B: the driver's calls, beside A.
  cudaMemPool_t b = testsupport::new_keeping_pool(0);
  CUdeviceptr q = 0;
  CHECK_CU(cu_alloc(&q, 10 * kMiB, reinterpret_cast<CUmemoryPool>(b), reinterpret_cast<CUstream>(s)));
  CHECK_CU(drv.MemFreeAsync(q, reinterpret_cast<CUstream>(s)));
  CHECK(cudaStreamSynchronize(s));
  step("b_freed", reserved_of(a) + reserved_of(b));
  CHECK_CU(cu_trim(reinterpret_cast<CUmemoryPool>(b), 0));
  step("b_trimmed", reserved_of(a) + reserved_of(b));
  CHECK_CU(cu_alloc(&q, 10 * kMiB, reinterpret_cast<CUmemoryPool>(b), reinterpret_cast<CUstream>(s)));
  CHECK_CU(drv.MemFreeAsync(q, reinterpret_cast<CUstream>(s)));
  CHECK(cudaStreamSynchronize(s));
  step("b_again", reserved_of(a) + reserved_of(b));

  // Destroyed: A through the runtime, B through the driver.
  CHECK(cudaMemPoolDestroy(a));
  step("a_destroyed", reserved_of(b));
  CHECK_CU(cu_destroy(reinterpret_cast<CUmemoryPool>(b)));
  step("b_destroyed", 0);

  // C: destroyed with 40 MiB still allocated from it; that allocation stays until freed.
  cudaMemPool_t c = testsupport::new_keeping_pool(0);
  CHECK(cudaMallocFromPoolAsync(&p, 40 * kMiB, c, s));
  CHECK(cudaStreamSynchronize(s));
  step("c_allocated", reserved_of(c));
  CHECK(cudaMemPoolDestroy(c));
  step("c_destroyed_live", 40 * kMiB);
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  step("c_freed", 0);

  cudaMemPool_t def = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
  // A pool the program made current, then destroyed: CUDA makes the default pool current again,
  // so the default pool serves cudaMallocAsync again, and its used figure shows it (under caching
  // and vmm the shim's pool is the default pool and answers for it).
  cudaMemPool_t d = testsupport::new_keeping_pool(0);
  CHECK(cudaDeviceSetMemPool(0, d));
  CHECK(cudaMemPoolDestroy(d));
  cudaMemPool_t current = nullptr;
  CHECK(cudaDeviceGetMemPool(&current, 0));
  uint64_t used_before = 0, used_after = 0;
  CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &used_before));
  CHECK(cudaMallocAsync(&p, 3 * kMiB, s));
  CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &used_after));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));

  // The default pool cannot be destroyed: refused, and what it holds is still held.
  uint64_t keep = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep));
  CHECK(cudaMallocAsync(&p, 8 * kMiB, s));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  const cudaError_t refused = cudaMemPoolDestroy(def);
  (void)cudaGetLastError();
  step("default_kept", reserved_of(def));
  CHECK(cudaMemPoolTrimTo(def, 0));
  step("default_trimmed", reserved_of(def));

  // The driver API's stream-ordered calls reach CUDA's default pool past any pool of ours: the
  // threshold the program set on the default pool must keep what it frees there too (it was kept
  // by our pool alone, and CUDA's gave everything back at each synchronization).
  const auto device_used = testsupport::driver_function<size_t (*)(int)>("fakecudaDeviceUsedBytes");
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep));
  const size_t used_before_driver = device_used(0);
  CHECK_CU(drv.MemAllocAsync(&q, 16 * kMiB, reinterpret_cast<CUstream>(s)));
  CHECK_CU(drv.MemFreeAsync(q, reinterpret_cast<CUstream>(s)));
  CHECK(cudaStreamSynchronize(s));
  const size_t kept_by_cuda = device_used(0) - used_before_driver;
  CHECK(cudaMemPoolTrimTo(def, 0));
  const size_t trimmed_by_cuda = device_used(0) - used_before_driver;

  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));  // the report's driver sample: after everything
  CHECK(cudaStreamDestroy(s));
  std::printf("{\"default_destroy\":\"%s\",\"default_current_again\":%s,\"default_pool_served\":%llu,"
              "\"driver_kept_by_cuda\":%zu,\"driver_trimmed_by_cuda\":%zu,\"steps\":{%s}}\n",
              cudaGetErrorName(refused), current == def ? "true" : "false",
              static_cast<unsigned long long>(used_after - used_before), kept_by_cuda, trimmed_by_cuda,
              g_steps.c_str());
  return 0;
}
