// Allocates through every intercepted entry point and frees it all: nothing may be live at exit.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "support/test_support.h"

int main() {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* m = nullptr;
  void* h = nullptr;
  void* h2 = nullptr;
  size_t pitch = 0;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMalloc(&a, 1000));
  CHECK(cudaMallocAsync(&b, 3 << 20, s));
  CHECK(cudaMallocPitch(&c, &pitch, 1000, 10));
  CHECK(cudaMallocManaged(&m, 1 << 16, cudaMemAttachGlobal));
  CHECK(cudaMallocHost(&h, 4096));
  CHECK(cudaHostAlloc(&h2, 8192, cudaHostAllocDefault));
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (total_b == 0 || free_b > total_b) return 2;
  CHECK(cudaFree(a));
  CHECK(cudaFreeAsync(b, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaFree(c));
  CHECK(cudaFree(m));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFreeHost(h2));
  CHECK(cudaStreamDestroy(s));
  std::printf("pitch=%zu\n", pitch);
  return 0;
}
