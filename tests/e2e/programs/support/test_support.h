// Shared by the end-to-end programs. Everything here works on the simulated device and, unchanged,
// on a real GPU: test-only entry points are looked up at run time, never linked.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "public/gpushim.h"

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace testsupport {

// A kernel that waits `delay_us` in stream order, then fills `bytes` at `dst` with `value`: the
// simulated device exports it; on a GPU it comes from libgpushim_testkernels.so (tests/gpu).
inline cudaError_t delayed_fill(void* dst, int value, size_t bytes, unsigned delay_us, cudaStream_t stream) {
  using Fn = int (*)(void*, int, size_t, unsigned, cudaStream_t);
  static Fn fn = [] {
    void* f = dlsym(RTLD_DEFAULT, "fakecudaLaunchDelayedFill");
    if (f == nullptr) {
      if (void* lib = dlopen("libgpushim_testkernels.so", RTLD_NOW | RTLD_GLOBAL)) f = dlsym(lib, "fakecudaLaunchDelayedFill");
    }
    if (f == nullptr) {
      std::fprintf(stderr, "no delayed-fill kernel: run on the simulated device or build tests/gpu\n");
      std::exit(3);
    }
    return reinterpret_cast<Fn>(f);
  }();
  return static_cast<cudaError_t>(fn(dst, value, bytes, delay_us, stream));
}

// The shim's figures for `device`, or false when the program runs without the shim.
inline bool shim_stats(int device, gpushim_device_stats* out) {
  using Fn = int (*)(int, gpushim_device_stats*);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpushim_get_device_stats"));
  if (fn == nullptr) return false;
  out->struct_size = sizeof(*out);
  return fn(device, out) == 0;
}

// Whether a file whose path contains `name` is mapped into this process (/proc/self/maps).
inline bool mapped(const char* name) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) found = std::strstr(line, name) != nullptr;
  std::fclose(f);
  return found;
}

}  // namespace testsupport
