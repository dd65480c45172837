// A stream-ordered free from one of CUDA's own pools, issued while its stream is still busy: CUDA
// gives the memory back (release threshold 0, its default) only once the stream reaches the free,
// after the shim read what the pool reserves at the free. Nothing afterwards makes the shim read
// the pool again (no allocation, trim or sample) but the program's own query of the pool at the
// end, whose answer the shim takes; without it ("no-end-query") only a reading when the report is
// written can find the reservation gone. First argument: "default" allocates with cudaMallocAsync
// from the device's current pool (CUDA's own under passthrough only); "created" (the default) from
// a pool of the program's, CUDA's own under every policy. Then, in any order: "teardown" (the
// simulated runtime only) has the runtime's teardown at exit release its primary context, which
// destroys the created pool before the exit report is written; "no-end-query". Prints, as JSON,
// the pool's reservation while the allocation was live and at the end (unless no-end-query), and
// what the shim said the device reserves at the end (gpushim_get_device_stats; absent without the
// shim).
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;

bool has_arg(int argc, char** argv, const char* arg) {
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], arg) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const bool use_default = argc > 1 && std::strcmp(argv[1], "default") == 0;
  const bool end_query = !has_arg(argc, argv, "no-end-query");
  if (has_arg(argc, argv, "teardown")) {
    auto release = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "fakecudaReleaseContextsAtTeardown"));
    if (release == nullptr) return 3;  // NVIDIA's runtime
    release(1);
  }
  CHECK(cudaFree(nullptr));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool = nullptr;
  if (use_default) CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  else pool = testsupport::new_device_pool(0);
  void* p = nullptr;
  if (use_default) CHECK(cudaMallocAsync(&p, 100 * kMiB, s));
  else CHECK(cudaMallocFromPoolAsync(&p, 100 * kMiB, pool, s));
  uint64_t live = 0, end = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &live));
  std::atomic<bool> issued{false};
  CHECK(testsupport::hold_stream_until(s, &issued));  // until the program has issued the free
  CHECK(cudaFreeAsync(p, s));
  issued.store(true, std::memory_order_release);
  CHECK(cudaStreamSynchronize(s));
  std::printf("{\"reserved_live\":%llu", static_cast<unsigned long long>(live));
  if (end_query) {
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &end));
    std::printf(",\"reserved_end\":%llu", static_cast<unsigned long long>(end));
  }
  gpushim_device_stats shim{};
  if (testsupport::shim_stats(0, &shim))
    std::printf(",\"shim_reserved_end\":%llu", static_cast<unsigned long long>(shim.reserved_bytes));
  std::printf("}\n");
  return 0;
}
