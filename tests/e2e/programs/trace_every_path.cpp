// Device memory through every path a program or library takes, some freed and some left live:
// the runtime (plain, pitched, stream-ordered), the driver API (plain, pitched, stream-ordered)
// and the virtual-memory API. A trace of this run must hold every allocation and free the report
// counts.
#include <cstring>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;

void runtime_paths() {
  void *a = nullptr, *b = nullptr, *c = nullptr, *live = nullptr;
  size_t pitch = 0;
  CHECK(cudaMalloc(&a, 3 * kMiB));
  CHECK(cudaMallocPitch(&b, &pitch, 1000, 100));
  CHECK(cudaMallocAsync(&c, 2 * kMiB, nullptr));
  CHECK(cudaMalloc(&live, kMiB));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFreeAsync(c, nullptr));
  CHECK(cudaStreamSynchronize(nullptr));
}

void driver_paths() {
  using AllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
  const testsupport::Driver& d = testsupport::driver();
  auto alloc_async = testsupport::driver_function<AllocAsync>("cuMemAllocAsync");
  CUdeviceptr a = 0, b = 0, c = 0, live = 0, live_pitched = 0;
  size_t pitch = 0;
  CHECK_CU(d.MemAlloc(&a, 5 * kMiB));
  CHECK_CU(d.MemAllocPitch(&b, &pitch, 3000, 50, 4));
  CHECK_CU(alloc_async(&c, 4 * kMiB, nullptr));
  CHECK_CU(d.MemAlloc(&live, 2 * kMiB));
  CHECK_CU(d.MemAllocPitch(&live_pitched, &pitch, 512, 8, 8));
  CHECK_CU(d.MemFree(a));
  CHECK_CU(d.MemFree(b));
  CHECK_CU(d.MemFreeAsync(c, nullptr));
  CHECK_CU(d.StreamSynchronize(nullptr));
}

void vmm_paths() {
  const testsupport::Driver& d = testsupport::driver();
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  const size_t size = 2 * kMiB;
  for (int i = 0; i < 2; ++i) {
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    CHECK_CU(d.MemCreate(&h, size, &prop, 0));
    CHECK_CU(d.MemAddressReserve(&va, size, 0, 0, 0));
    CHECK_CU(d.MemMap(va, size, 0, h, 0));
    if (i == 0) {  // the first is torn down, the second stays live
      CHECK_CU(d.MemUnmap(va, size));
      CHECK_CU(d.MemRelease(h));
      CHECK_CU(d.MemAddressFree(va, size));
    }
  }
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  runtime_paths();
  driver_paths();
  vmm_paths();
  std::printf("{\"done\": true}\n");
  return 0;
}
