// A library linked against the dynamic libcudart, allocating through it: cudaMalloc (which our
// runtime hook serves) and cudaMallocFromPoolAsync (which it does not: the real runtime turns it
// into cuMemAllocFromPoolAsync, reached through the cuGetProcAddress answer we substituted, so the
// caller is found past libcudart's own frames).
#include <cuda_runtime_api.h>

#include <cstdio>

#define RT_CHECK(x)                                                                                  \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_));  \
      return static_cast<int>(e_);                                                                   \
    }                                                                                                \
  } while (0)

extern "C" int dynamic_runtime_allocate(size_t plain, size_t from_pool) {
  void* p = nullptr;
  RT_CHECK(cudaMalloc(&p, plain));
  int dev = 0;
  RT_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool = nullptr;
  RT_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  void* q = nullptr;
  RT_CHECK(cudaMallocFromPoolAsync(&q, from_pool, pool, nullptr));
  RT_CHECK(cudaStreamSynchronize(nullptr));
  return 0;
}
