// Memory no allocation call returns (the context, module images) shows as "unaccounted" per
// device; cuMemGetInfo_v2 is capped like cudaMemGetInfo. Allocates on every device with both APIs,
// then prints what the driver charged each device and what cuMemGetInfo_v2 said.
#include <cuda.h>

#include "support/driver_api.h"
#include "support/test_support.h"

int main() {
  const testsupport::Driver& D = testsupport::driver();
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  auto used = testsupport::driver_test_hook<size_t (*)(int)>("fakecudaDeviceUsedBytes");
  std::printf("{\"devices\":%d", n);
  for (int dev = 0; dev < n; ++dev) {
    CHECK(cudaSetDevice(dev));
    void* p = nullptr;
    CHECK(cudaMalloc(&p, static_cast<size_t>(dev + 1) << 20));
    CUdeviceptr d = 0;
    if (D.MemAlloc(&d, static_cast<size_t>(dev + 3) << 20) != CUDA_SUCCESS) return 1;
  }
  // Asking each device for its figures makes the shim sample it: that sample sees everything.
  for (int dev = 0; dev < n; ++dev) {
    CHECK(cudaSetDevice(dev));
    size_t free = 0, total = 0;
    if (D.MemGetInfo(&free, &total) != CUDA_SUCCESS) return 1;
    std::printf(",\"used%d\":%zu,\"free%d\":%zu,\"total%d\":%zu", dev, used ? used(dev) : 0, dev, free, dev, total);
    size_t only_total = 0;  // a null output pointer is legal
    if (D.MemGetInfo(nullptr, &only_total) != CUDA_SUCCESS || only_total != total) return 1;
  }
  std::printf("}\n");
  return 0;
}
