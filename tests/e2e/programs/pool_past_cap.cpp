// An allocation from a memory pool the program made, past GPUSHIM_LIMIT: CUDA picks the device, so
// the shim asks the cap after the pool made it, and frees it again. The pool keeps what it reserved
// for it (its release threshold is max), which the process then holds from the driver: the shim's
// reserved must say so, and the driver's figure, read after it, show nothing unaccounted. What the
// pool holds counts against the cap as everything held from the driver does: a cudaMalloc that
// fits beside the program's own 200 MiB but not beside the pool's reserve too is refused, and the
// capped free memory is what is left beside both. Prints the answers, the pool's reservation, the
// shim's reserved figure and the capped free memory, as JSON.
#include <cstdint>

#include "support/test_support.h"

int main() {
  constexpr size_t kMiB = 1 << 20;
  CHECK(cudaFree(nullptr));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool = testsupport::new_keeping_pool(0);
  void* held = nullptr;
  CHECK(cudaMalloc(&held, 200 * kMiB));
  void* p = nullptr;
  const cudaError_t refused = cudaMallocFromPoolAsync(&p, 100 * kMiB, pool, s);
  (void)cudaGetLastError();
  CHECK(cudaStreamSynchronize(s));
  uint64_t pool_reserved = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &pool_reserved));
  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));  // the report's driver sample: after the refusal
  void* beside_pool = nullptr;
  const cudaError_t beside = cudaMalloc(&beside_pool, 50 * kMiB);
  (void)cudaGetLastError();
  if (beside == cudaSuccess) CHECK(cudaFree(beside_pool));
  gpushim_device_stats st = {};
  testsupport::shim_stats(0, &st);
  std::printf("{\"refused\":\"%s\",\"beside\":\"%s\",\"pool_reserved\":%llu,\"reserved\":%llu,\"free\":%llu}\n",
              cudaGetErrorName(refused), cudaGetErrorName(beside), static_cast<unsigned long long>(pool_reserved),
              static_cast<unsigned long long>(st.reserved_bytes), static_cast<unsigned long long>(free));
  CHECK(cudaStreamDestroy(s));
  return 0;
}
