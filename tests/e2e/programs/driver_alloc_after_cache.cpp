// A library's driver-API allocation (cuMemAlloc: NCCL's buffers, a BLAS workspace) while the pool
// caches what the program freed: the pool's cached memory must go back to make room, as it does for
// the pool's own requests. The program frees 200 MiB through the runtime (the pool keeps it cached)
// and then asks the driver for 100 MiB; run on a 256 MiB device, or under a 256 MiB cap. Prints
// {"driver_alloc": CUresult, "holds": bool}. With the argument `cached-only` it stops after the
// free: the pool's whole cache then waits for the fence of that free at exit.
#include <cstdio>
#include <string>

#include "support/driver_api.h"
#include "support/test_support.h"

int main(int argc, char** argv) {
  constexpr size_t kMiB = 1 << 20;
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 200 * kMiB));
  CHECK(cudaMemset(p, 0x11, 200 * kMiB));
  CHECK(cudaFree(p));
  if (argc > 1 && std::string(argv[1]) == "cached-only") return 0;
  CUdeviceptr d = 0;
  const CUresult r = testsupport::driver().MemAlloc(&d, 100 * kMiB);
  bool holds = false;
  if (r == CUDA_SUCCESS) {
    CHECK(cudaMemset(reinterpret_cast<void*>(d), 0x22, 100 * kMiB));
    unsigned char byte = 0;
    CHECK(cudaMemcpy(&byte, reinterpret_cast<char*>(d) + 54321, 1, cudaMemcpyDeviceToHost));
    holds = byte == 0x22;
    CHECK_CU(testsupport::driver().MemFree(d));
  }
  std::printf("{\"driver_alloc\": %d, \"holds\": %s}\n", static_cast<int>(r), holds ? "true" : "false");
  return 0;
}
