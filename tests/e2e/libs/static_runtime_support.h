// How a library that carries its own static copy of the CUDA runtime (NCCL, cuBLAS, cuDNN) reaches
// the driver: dlopen("libcuda.so.1"), one handle-scoped dlsym for cuGetProcAddress, and every
// other driver function through it, by base name, ABI version and stream flags. Such a library
// never touches the dynamic libcudart's symbols, nor the driver's exported ones.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace staticrt {

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

inline void* libcuda() {
  static void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
    std::exit(2);
  }
  return h;
}

// The 5-argument form, as CUDA 12+ runtimes use it.
inline GetProcV2 get_proc_v2() {
  static GetProcV2 fn = reinterpret_cast<GetProcV2>(dlsym(libcuda(), "cuGetProcAddress_v2"));
  return fn;
}

template <typename F>
F resolve(const char* name, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (get_proc_v2()(name, &p, version, flags, &status) != CUDA_SUCCESS || p == nullptr) {
    std::fprintf(stderr, "cuGetProcAddress_v2(%s, %d) failed (status %d)\n", name, version, static_cast<int>(status));
    std::exit(2);
  }
  return reinterpret_cast<F>(p);
}

#define STATICRT_CHECK(x)                                                                      \
  do {                                                                                         \
    CUresult r_ = (x);                                                                         \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

}  // namespace staticrt
