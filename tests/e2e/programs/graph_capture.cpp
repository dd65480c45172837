// Allocation during CUDA graph capture: the pool must not synchronize or query events on the
// capturing stream (that would invalidate the capture), and cudaMallocAsync during capture goes
// to the real runtime (graph-owned memory).
#include "support/test_support.h"

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Freed memory waiting for reuse, so that a careless pool would be tempted to synchronize.
  for (int i = 0; i < 8; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 8 << 20));
    CHECK(cudaFree(p));
  }
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  void* plain = nullptr;
  const cudaError_t plain_err = cudaMalloc(&plain, 16 << 20);  // PyTorch does this in relaxed mode
  void* graph_mem = nullptr;
  const cudaError_t async_err = cudaMallocAsync(&graph_mem, 1 << 20, s);
  if (async_err == cudaSuccess) CHECK(cudaFreeAsync(graph_mem, s));
  cudaGraph_t graph = nullptr;
  const cudaError_t end_err = cudaStreamEndCapture(s, &graph);
  if (plain_err == cudaSuccess) CHECK(cudaFree(plain));
  if (graph) cudaGraphDestroy(graph);
  CHECK(cudaStreamDestroy(s));
  std::printf("{\"malloc_in_capture\":\"%s\",\"malloc_async_in_capture\":\"%s\",\"end_capture\":\"%s\"}\n",
              cudaGetErrorName(plain_err), cudaGetErrorName(async_err), cudaGetErrorName(end_err));
  return 0;
}
