// A pitched allocation under passthrough is accounted after the fact (the runtime picks the pitch):
// its free must give back exactly what it took from the cap, so the cap still works afterwards.
#include "support/test_support.h"

int main() {
  void* p = nullptr;
  size_t pitch = 0;
  CHECK(cudaMallocPitch(&p, &pitch, 1000, 1000));
  CHECK(cudaFree(p));
  void* big = nullptr;
  const cudaError_t e = cudaMalloc(&big, 512u << 20);
  gpushim_device_stats st = {};
  testsupport::shim_stats(0, &st);
  std::printf("{\"pitch\":%zu,\"after\":\"%s\",\"reserved\":%llu}\n", pitch, cudaGetErrorName(e),
              static_cast<unsigned long long>(st.reserved_bytes));
  return 0;
}
