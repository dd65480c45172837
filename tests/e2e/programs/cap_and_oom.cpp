// Allocates fixed-size blocks until the device (or the GPUSHIM_LIMIT cap) refuses, and prints what
// it saw as JSON: cudaMemGetInfo before, how many blocks fit, the error code, and whether freeing
// one block makes the next allocation succeed again.
//
// Usage: e2e_cap_and_oom <block MiB> [max blocks] [driver MiB] [retries]
//   driver MiB: first holds that much through the driver API (cuMemAlloc_v2), as a library would
//   retries: after the first refusal, asks that many more times (a program handling OOMs in a loop)
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

int main(int argc, char** argv) {
  const size_t block = static_cast<size_t>(argc > 1 ? std::atoi(argv[1]) : 64) << 20;
  const int max_blocks = argc > 2 ? std::atoi(argv[2]) : 100000;
  const size_t driver_bytes = static_cast<size_t>(argc > 3 ? std::atoi(argv[3]) : 0) << 20;
  CUdeviceptr library = 0;
  if (driver_bytes != 0) {
    CHECK(cudaSetDevice(0));  // the runtime's context, which the driver call then uses
    CHECK_CU(testsupport::driver().MemAlloc(&library, driver_bytes));
  }
  size_t free0 = 0, total0 = 0;
  CHECK(cudaMemGetInfo(&free0, &total0));
  std::vector<void*> held;
  cudaError_t err = cudaSuccess;
  while (static_cast<int>(held.size()) < max_blocks) {
    void* p = nullptr;
    err = cudaMalloc(&p, block);
    if (err != cudaSuccess) break;
    held.push_back(p);
  }
  const int retries = argc > 4 ? std::atoi(argv[4]) : 0;
  int refused_again = 0;
  for (int i = 0; i < retries && err != cudaSuccess; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, block) != cudaSuccess) ++refused_again;
    else CHECK(cudaFree(p));
  }
  const cudaError_t last = cudaGetLastError();  // clears the sticky-free error state, as apps do
  (void)last;
  size_t free1 = 0, total1 = 0;
  CHECK(cudaMemGetInfo(&free1, &total1));
  bool recovered = false;
  if (!held.empty() && err != cudaSuccess) {
    CHECK(cudaFree(held.back()));
    held.pop_back();
    void* p = nullptr;
    recovered = cudaMalloc(&p, block) == cudaSuccess;
    if (recovered) held.push_back(p);
  }
  for (void* p : held) CHECK(cudaFree(p));
  if (library != 0) CHECK_CU(testsupport::driver().MemFree(library));
  std::printf("{\"free_before\":%zu,\"total_before\":%zu,\"blocks\":%zu,\"error\":\"%s\",\"free_at_oom\":%zu,"
              "\"total_at_oom\":%zu,\"recovered\":%s,\"refused_again\":%d}\n",
              free0, total0, held.size(), cudaGetErrorName(err), free1, total1,
              recovered ? "true" : "false", refused_again);
  return 0;
}
