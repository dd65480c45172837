// Test hooks of the simulated device (tests/fakecuda/fakecuda.h), looked up at run time so that
// the bench programs also run on a real GPU, where these hooks do not exist and read as 0.
#pragma once

#include <dlfcn.h>

#include <cstddef>

namespace gpushim_bench {

// The fake libcudart loads libcuda.so.1 with RTLD_LOCAL, so its symbols are not in the global
// scope: ask the already-loaded library itself (RTLD_NOLOAD never loads anything).
inline void* simulated_driver_symbol(const char* name) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return lib ? dlsym(lib, name) : nullptr;
}

// Device memory in use on `device`, as the simulated device charges it; 0 on a real GPU.
inline size_t simulated_device_used(int device) {
  using Fn = size_t (*)(int);
  static Fn fn = reinterpret_cast<Fn>(simulated_driver_symbol("fakecudaDeviceUsedBytes"));
  return fn ? fn(device) : 0;
}

// Allocation calls that reached the simulated driver so far (cuMemAlloc*, device cuMemCreate...);
// 0 on a real GPU.
inline unsigned long long simulated_driver_allocs() {
  using Fn = unsigned long long (*)();
  static Fn fn = reinterpret_cast<Fn>(simulated_driver_symbol("fakecudaDriverAllocCount"));
  return fn ? fn() : 0;
}

// Successful release calls (cuMemFree*, cuMemRelease of device memory) so far; 0 on a real GPU.
inline unsigned long long simulated_driver_frees() {
  using Fn = unsigned long long (*)();
  static Fn fn = reinterpret_cast<Fn>(simulated_driver_symbol("fakecudaDriverFreeCount"));
  return fn ? fn() : 0;
}

// Device-wide synchronizations so far: explicit ones and those implied by cuMemFree and
// cuMemUnmap; 0 on a real GPU.
inline unsigned long long simulated_device_syncs() {
  using Fn = unsigned long long (*)();
  static Fn fn = reinterpret_cast<Fn>(simulated_driver_symbol("fakecudaDeviceSyncCount"));
  return fn ? fn() : 0;
}

}  // namespace gpushim_bench
