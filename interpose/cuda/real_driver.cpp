#include "cuda/real_driver.h"

#include <dlfcn.h>

#include <atomic>

#include "cuda/real_symbols.h"
#include "util/dlopen_guard.h"

namespace gpushim {
namespace {

std::atomic<const RealDriver*> g_table{nullptr};
thread_local bool t_resolving = false;

RealDriver* resolve() {
  auto* t = new RealDriver;
  // The handle stays open: the driver lives as long as the process.
  void* lib = guarded_dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) {
#define GPUSHIM_REAL_DRIVER_LOAD(member, symbol, type) t->member = reinterpret_cast<type>(real_dlsym(lib, symbol));
    GPUSHIM_REAL_DRIVER_FUNCTIONS(GPUSHIM_REAL_DRIVER_LOAD)
#undef GPUSHIM_REAL_DRIVER_LOAD
  }
  return t;
}

}  // namespace

const RealDriver& real_driver() {
  static const RealDriver empty;
  if (const RealDriver* t = g_table.load(std::memory_order_acquire)) return *t;
  // No lock around dlopen: a thread inside dlopen (holding the loader's lock) may be running a
  // constructor that calls a hook, and would wait for us while we wait for it. Racing threads
  // resolve the same table; one is kept.
  if (t_resolving) return empty;
  t_resolving = true;
  RealDriver* fresh = resolve();
  t_resolving = false;
  const RealDriver* expected = nullptr;
  if (!g_table.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) {
    delete fresh;
    return *expected;
  }
  return *fresh;
}

bool current_context_device(int* device) {
  const RealDriver& d = real_driver();
  if (d.cuCtxGetCurrent == nullptr || d.cuCtxGetDevice == nullptr) return false;
  CUcontext ctx = nullptr;
  if (d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return false;
  CUdevice dev = 0;
  if (d.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return false;
  *device = static_cast<int>(dev);
  return true;
}

CUcontext primary_context_if_active(int ordinal) {
  const RealDriver& d = real_driver();
  if (!d.cuDeviceGet || !d.cuDevicePrimaryCtxGetState || !d.cuDevicePrimaryCtxRetain || !d.cuDevicePrimaryCtxRelease_v2)
    return nullptr;
  CUdevice dev = 0;
  unsigned flags = 0;
  int active = 0;
  if (d.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || d.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
      active == 0)
    return nullptr;
  CUcontext ctx = nullptr;
  if (d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  d.cuDevicePrimaryCtxRelease_v2(dev);
  return ctx;
}

int device_of_primary_context(CUcontext ctx) {
  const RealDriver& d = real_driver();
  int count = 0;
  if (ctx == nullptr || !d.cuDeviceGetCount || d.cuDeviceGetCount(&count) != CUDA_SUCCESS) return -1;
  for (int ordinal = 0; ordinal < count; ++ordinal)
    if (primary_context_if_active(ordinal) == ctx) return ordinal;
  return -1;
}

uint64_t device_total_memory(int ordinal) {
  const RealDriver& d = real_driver();
  if (d.cuInit == nullptr || d.cuDeviceGet == nullptr || d.cuDeviceTotalMem_v2 == nullptr) return 0;
  d.cuInit(0);  // idempotent; the runtime normally did it already
  CUdevice dev = 0;
  size_t bytes = 0;
  if (d.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || d.cuDeviceTotalMem_v2(&bytes, dev) != CUDA_SUCCESS) return 0;
  return bytes;
}

}  // namespace gpushim
