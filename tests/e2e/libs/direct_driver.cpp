// Behaves like JAX/XLA or TensorFlow: linked against libcuda and calling the driver API's exported
// functions directly.
#include <cuda.h>

#include <cstdio>

#define DRIVER_CHECK(x)                                                                          \
  do {                                                                                           \
    CUresult r_ = (x);                                                                           \
    if (r_ != CUDA_SUCCESS) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      return static_cast<int>(r_);                                                               \
    }                                                                                            \
  } while (0)

// Stays allocated: `device` bytes of device memory, `managed` of managed and `host` of pinned host
// memory. A temporary buffer of `device` bytes is freed again.
extern "C" int direct_driver_allocate(size_t device, size_t managed, size_t host) {
  CUdeviceptr d = 0, tmp = 0, m = 0;
  void* h = nullptr;
  DRIVER_CHECK(cuMemAlloc(&d, device));
  DRIVER_CHECK(cuMemAlloc(&tmp, device));
  DRIVER_CHECK(cuMemFree(tmp));
  DRIVER_CHECK(cuMemAllocManaged(&m, managed, CU_MEM_ATTACH_GLOBAL));
  DRIVER_CHECK(cuMemHostAlloc(&h, host, 0));
  return 0;
}
