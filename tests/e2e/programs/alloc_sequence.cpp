// Makes COUNT device allocations one after another and says which failed and how, so tests can
// check GPUSHIM_FAIL's modes and that an injected failure looks like a real out-of-memory error:
// the same return code, and the same answer from cudaGetLastError afterwards.
//
// Usage: e2e_alloc_sequence COUNT SIZES [APIS]
//   SIZES  comma-separated byte counts, used in turn ("4096,2097152")
//   APIS   letters used in turn: m cudaMalloc, a cudaMallocAsync, p cudaMallocPitch, and through
//          the driver API (dlsym on libcuda.so.1): d cuMemAlloc_v2, q cuMemAllocPitch_v2 (default "m")
// Prints one JSON line: the 1-based numbers of the failed allocations, the error names seen
// (driver errors as "CUresult N"), and whether every failure left the expected last error: the
// runtime's own error for a runtime call (cudaPeekAtLastError/cudaGetLastError), none for a driver
// call (the driver keeps no last error, and the runtime's must not change).
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const long count = std::atol(argv[1]);
  std::vector<size_t> sizes;
  for (char* tok = std::strtok(argv[2], ","); tok; tok = std::strtok(nullptr, ",")) sizes.push_back(std::strtoull(tok, nullptr, 10));
  const std::string apis = argc > 3 ? argv[3] : "m";
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  std::vector<void*> held;
  std::vector<CUdeviceptr> held_driver;
  std::vector<long> failed;
  std::set<std::string> errors;
  bool last_error_matches = true;
  for (long i = 1; i <= count; ++i) {
    const size_t size = sizes[(i - 1) % sizes.size()];
    const char api = apis[(i - 1) % apis.size()];
    if (api == 'd' || api == 'q') {
      CUdeviceptr d = 0;
      size_t pitch = 0;
      const CUresult r = api == 'd' ? testsupport::driver().MemAlloc(&d, size)
                                    : testsupport::driver().MemAllocPitch(&d, &pitch, size, 1, 4);
      if (r == CUDA_SUCCESS) {
        held_driver.push_back(d);
        continue;
      }
      failed.push_back(i);
      errors.insert("CUresult " + std::to_string(r));
      if (cudaPeekAtLastError() != cudaSuccess) last_error_matches = false;
      continue;
    }
    void* p = nullptr;
    cudaError_t e;
    switch (api) {
      case 'a': e = cudaMallocAsync(&p, size, stream); break;
      case 'p': {
        size_t pitch = 0;
        e = cudaMallocPitch(&p, &pitch, size, 1);
        break;
      }
      default: e = cudaMalloc(&p, size); break;
    }
    if (e == cudaSuccess) {
      held.push_back(p);
      continue;
    }
    failed.push_back(i);
    errors.insert(cudaGetErrorName(e));
    // A real failed allocation leaves its error as the thread's last error until it is read.
    if (cudaPeekAtLastError() != e || cudaGetLastError() != e || cudaGetLastError() != cudaSuccess)
      last_error_matches = false;
  }
  CHECK(cudaStreamSynchronize(stream));
  for (void* p : held) CHECK(cudaFree(p));
  for (CUdeviceptr d : held_driver)
    if (testsupport::driver().MemFree(d) != CUDA_SUCCESS) return 4;
  std::printf("{\"failed\":[");
  for (size_t i = 0; i < failed.size(); ++i) std::printf("%s%ld", i ? "," : "", failed[i]);
  std::printf("],\"errors\":[");
  size_t k = 0;
  for (const std::string& e : errors) std::printf("%s\"%s\"", k++ ? "," : "", e.c_str());
  std::printf("],\"last_error_matches\":%s,\"succeeded\":%zu}\n", last_error_matches ? "true" : "false", held.size());
  return 0;
}
