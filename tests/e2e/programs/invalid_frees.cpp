// Frees that CUDA would reject, mixed with valid work: a double free, an interior pointer, a host
// heap pointer, and a pointer that was never allocated. Prints each return code; the data of a
// live block must survive all of them.
#include <cstring>
#include <vector>

#include "support/test_support.h"

__attribute__((noinline)) cudaError_t free_twice(void* p) { return cudaFree(p); }

int main() {
  void* keep = nullptr;
  void* a = nullptr;
  CHECK(cudaMalloc(&keep, 1 << 20));
  CHECK(cudaMemset(keep, 0x5a, 1 << 20));
  CHECK(cudaMalloc(&a, 4096));
  CHECK(cudaFree(a));
  const cudaError_t twice = free_twice(a);
  cudaGetLastError();
  const cudaError_t interior = cudaFree(static_cast<char*>(keep) + 512);
  cudaGetLastError();
  void* heap = std::malloc(64);
  const cudaError_t host = cudaFree(heap);
  cudaGetLastError();
  std::free(heap);
  const cudaError_t never = cudaFree(reinterpret_cast<void*>(0x10));
  cudaGetLastError();
  std::vector<unsigned char> back(1 << 20);
  CHECK(cudaMemcpy(back.data(), keep, back.size(), cudaMemcpyDeviceToHost));
  bool intact = true;
  for (unsigned char c : back) intact &= c == 0x5a;
  CHECK(cudaFree(keep));
  std::printf("{\"double_free\":\"%s\",\"interior\":\"%s\",\"host\":\"%s\",\"never\":\"%s\",\"intact\":%s}\n",
              cudaGetErrorName(twice), cudaGetErrorName(interior), cudaGetErrorName(host), cudaGetErrorName(never),
              intact ? "true" : "false");
  return 0;
}
