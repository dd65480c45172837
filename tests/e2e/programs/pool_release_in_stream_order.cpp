// A stream-ordered free from one of CUDA's own pools, issued while its stream is still busy: CUDA
// gives the memory back (release threshold 0, its default) only once the stream reaches the free,
// after the shim read what the pool reserves at the free. Nothing afterwards makes the shim read
// the pool again (no allocation, trim or sample; the program's own query of CUDA's pool passes
// through), so only a reading when the report is
// written can find the reservation gone. Argument: "default" allocates with cudaMallocAsync from
// the device's current pool (CUDA's own under passthrough only); "created" (the default) from a
// pool of the program's, CUDA's own under every policy. Prints the pool's reservation while the
// allocation was live and at the end, as JSON. A second argument "teardown" (the simulated runtime
// only) has the runtime's teardown at exit release its primary context, which destroys the created
// pool before the exit report is written.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;

}  // namespace

int main(int argc, char** argv) {
  const bool use_default = argc > 1 && std::strcmp(argv[1], "default") == 0;
  if (argc > 2 && std::strcmp(argv[2], "teardown") == 0) {
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
  // The shim forwards this query of CUDA's pool without reading it for itself.
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &end));
  std::printf("{\"reserved_live\":%llu,\"reserved_end\":%llu}\n", static_cast<unsigned long long>(live),
              static_cast<unsigned long long>(end));
  return 0;
}
