// A CUDA program as nvcc builds it by default (static runtime), in the style of NVIDIA's samples:
// device query, allocations, a kernel on a stream, events, copies back, frees. Every call's result
// is checked; the first failure prints "FAILED <call>: <error name> (<code>)" and exits 2.
//
// On a GPU it runs to the end ("OK"). On the simulated device NVIDIA's static runtime stops at its
// integrity check (tests/fakecuda/driver/export_tables.cpp, docs/interception.md): the test
// (test_nvcc_programs.py) pins exactly how far it gets.
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CHECK(call)                                                                             \
  do {                                                                                          \
    cudaError_t err_ = (call);                                                                  \
    if (err_ != cudaSuccess) {                                                                  \
      std::printf("FAILED %s: %s (%d)\n", #call, cudaGetErrorName(err_), static_cast<int>(err_)); \
      return 2;                                                                                 \
    }                                                                                           \
  } while (0)

__global__ void fill_iota(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  std::printf("devices %d\n", count);
  const int n = 1 << 16;
  int* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  void* scratch = nullptr;
  CHECK(cudaMalloc(&scratch, 3 << 20));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t done;
  CHECK(cudaEventCreate(&done));
  CHECK(cudaMemsetAsync(d, 0xff, n * sizeof(int), stream));
  fill_iota<<<(n + 255) / 256, 256, 0, stream>>>(d, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(done, stream));
  CHECK(cudaEventSynchronize(done));
  int* h = static_cast<int*>(std::malloc(n * sizeof(int)));
  CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (h[i] != i) {
      std::printf("FAILED kernel result: h[%d] = %d\n", i, h[i]);
      return 2;
    }
  }
  std::free(h);
  CHECK(cudaFree(scratch));
  CHECK(cudaFree(d));
  CHECK(cudaEventDestroy(done));
  CHECK(cudaStreamDestroy(stream));
  std::printf("OK\n");
  return 0;
}
