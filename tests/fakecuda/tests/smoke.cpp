// A plain CUDA runtime program: compiled against the real headers, linked only with -lcudart
// (the fake), finding libcuda.so.1 through LD_LIBRARY_PATH at run time like any CUDA program.
//   fakecuda_smoke                     expects a working device, exits 0
//   fakecuda_smoke --expect-no-driver  expects cudaErrorInsufficientDriver (no libcuda.so.1
//                                      reachable); exits 77 (skip) if one was found anyway
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const bool expect_no_driver = argc > 1 && std::strcmp(argv[1], "--expect-no-driver") == 0;
  int count = -1;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (expect_no_driver) {
    if (e == cudaSuccess) {
      std::printf("smoke: a libcuda.so.1 is installed on this system; skipping\n");
      return 77;
    }
    void* p = nullptr;
    const cudaError_t m = cudaMalloc(&p, 16);
    std::printf("smoke: cudaGetDeviceCount=%s cudaMalloc=%s count=%d\n", cudaGetErrorName(e), cudaGetErrorName(m),
                count);
    return (e == cudaErrorInsufficientDriver && m == cudaErrorInsufficientDriver && count == 0) ? 0 : 1;
  }
  if (e != cudaSuccess || count < 1) {
    std::printf("smoke: cudaGetDeviceCount failed: %s\n", cudaGetErrorString(e));
    return 1;
  }
  const size_t n = 1 << 20;
  std::vector<int> host(n / sizeof(int)), back(n / sizeof(int));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int>(i);
  void* dev = nullptr;
  cudaStream_t s = nullptr;
  if (cudaMalloc(&dev, n) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess ||
      cudaMemcpyAsync(dev, host.data(), n, cudaMemcpyHostToDevice, s) != cudaSuccess ||
      cudaMemcpyAsync(back.data(), dev, n, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess || cudaFree(dev) != cudaSuccess) {
    std::printf("smoke: CUDA call failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  if (host != back) {
    std::printf("smoke: data mismatch\n");
    return 1;
  }
  std::printf("smoke: ok (%d device(s))\n", count);
  return 0;
}
