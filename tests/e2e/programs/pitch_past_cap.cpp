// Pitched allocations past GPUSHIM_LIMIT: 200 MiB held, then 1 MiB x 100 rows pitched through the
// runtime (cudaMallocPitch) and through the driver (cuMemAllocPitch_v2). Under every policy both
// must be refused like an out-of-memory error, and nothing CUDA made for them may stay behind: the
// driver's figure, read after them, is what the program holds. Prints what it saw as JSON.
#include "support/driver_api.h"
#include "support/test_support.h"

int main() {
  CHECK(cudaFree(nullptr));
  void* keep = nullptr;
  CHECK(cudaMalloc(&keep, 200u << 20));
  void* p = nullptr;
  size_t pitch = 0;
  const cudaError_t runtime = cudaMallocPitch(&p, &pitch, 1u << 20, 100);
  const cudaError_t last = cudaGetLastError();
  CUdeviceptr d = 0;
  size_t dpitch = 0;
  const CUresult driver = testsupport::driver().MemAllocPitch(&d, &dpitch, 1u << 20, 100, 4);
  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));  // the report's driver sample: after both calls
  gpushim_device_stats st = {};
  testsupport::shim_stats(0, &st);
  std::printf("{\"runtime\":\"%s\",\"last\":\"%s\",\"driver\":%d,\"live\":%llu,\"reserved\":%llu}\n",
              cudaGetErrorName(runtime), cudaGetErrorName(last), static_cast<int>(driver),
              static_cast<unsigned long long>(st.live_bytes), static_cast<unsigned long long>(st.reserved_bytes));
  CHECK(cudaFree(keep));
  return 0;
}
