// Memory taken while one of CUDA's own pools keeps a reservation it no longer uses (release
// threshold max): the pool's slack and the new memory are held from the driver together, so the
// peak of reserved must count both, whichever way the new memory is taken (cudaMalloc, which the
// pool of ours or CUDA serves, and the driver API's cuMemAlloc). Each is freed again before the
// report, so only the peak remembers it. Prints CUDA's reservation of the pool, and the shim's
// reserved and peak reserved at each step, as JSON.
#include <cstdint>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {
constexpr size_t kMiB = 1 << 20;
}  // namespace

int main() {
  CHECK(cudaFree(nullptr));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool = testsupport::new_keeping_pool(0);
  void* p = nullptr;
  CHECK(cudaMallocFromPoolAsync(&p, 1 * kMiB, pool, s));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  uint64_t slack = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &slack));

  gpushim_device_stats with_malloc = {}, with_driver = {};
  CHECK(cudaMalloc(&p, 100 * kMiB));
  testsupport::shim_stats(0, &with_malloc);
  CHECK(cudaFree(p));
  CUdeviceptr q = 0;
  CHECK_CU(testsupport::driver().MemAlloc(&q, 200 * kMiB));
  testsupport::shim_stats(0, &with_driver);
  CHECK_CU(testsupport::driver().MemFree(q));
  CHECK(cudaStreamDestroy(s));
  std::printf("{\"slack\":%llu,\"malloc\":[%llu,%llu],\"driver\":[%llu,%llu]}\n", static_cast<unsigned long long>(slack),
              with_malloc.reserved_bytes, with_malloc.peak_reserved_bytes, with_driver.reserved_bytes,
              with_driver.peak_reserved_bytes);
  return 0;
}
