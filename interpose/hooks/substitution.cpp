#include "hooks/substitution.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "cuda/real_symbols.h"

namespace gpushim {
namespace {

// Driver hooks of ours (hooks/driver_api.cpp, hooks/proc_address.cpp), by exported variant name.
constexpr const char* kDriverNames[] = {
    "cuMemAlloc_v2",          "cuMemFree_v2",          "cuMemAllocPitch_v2",
    "cuMemAllocManaged",      "cuMemHostAlloc",        "cuMemAllocHost_v2",
    "cuMemFreeHost",          "cuMemAllocAsync",       "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",    "cuMemCreate",           "cuMemRelease",
    "cuMemRetainAllocationHandle", "cuMemMap",         "cuMemUnmap",
    "cuMemAddressReserve",    "cuMemAddressFree",      "cuMemImportFromShareableHandle",
    "cuGraphAddMemAllocNode", "cuMemGetInfo_v2",       "cuMemGetAddressRange_v2",
    "cuPointerGetAttribute",  "cuPointerGetAttributes", "cuIpcGetMemHandle",
    "cuGetProcAddress",       "cuGetProcAddress_v2",
    "cuMemPoolGetAttribute",  "cuMemPoolSetAttribute", "cuMemPoolTrimTo",
    "cuDeviceSetMemPool",
    "cuStreamCreate",         "cuStreamCreateWithPriority", "cuStreamDestroy_v2",
    "cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxRelease_v2",
    "cuCtxDestroy_v2",        "cuCtxDestroy",
};
// Runtime hooks of ours (hooks/runtime_api.cpp, hooks/capture_api.cpp), for dlsym on a libcudart
// handle: what ctypes.CDLL("libcudart.so.13").cudaMalloc does.
constexpr const char* kRuntimeNames[] = {
    "cudaMalloc",           "cudaFree",               "cudaMallocAsync",        "cudaMallocAsync_ptsz",
    "cudaFreeAsync",        "cudaFreeAsync_ptsz",     "cudaMallocPitch",        "cudaMemGetInfo",
    "cudaMallocManaged",    "cudaMallocHost",         "cudaHostAlloc",          "cudaFreeHost",
    "cudaIpcGetMemHandle",  "cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz",
    "cudaStreamEndCapture", "cudaStreamEndCapture_ptsz",
    "cudaMemPoolGetAttribute", "cudaMemPoolSetAttribute", "cudaMemPoolTrimTo", "cudaDeviceSetMemPool",
    "cudaDeviceReset",
};
constexpr size_t kDrivers = sizeof(kDriverNames) / sizeof(kDriverNames[0]);
constexpr size_t kRuntimes = sizeof(kRuntimeNames) / sizeof(kRuntimeNames[0]);

struct Pair {
  std::atomic<void*> ours{nullptr};
  std::atomic<void*> real{nullptr};
};
Pair g_driver[kDrivers];
Pair g_runtime[kRuntimes];
std::atomic<bool> g_driver_complete{false};

void anchor() {}

// Our own library, by handle: a lookup there finds our definitions first whatever the global
// scope looks like (even if the shim was dlopen'ed rather than preloaded). No lock is held around
// these loader calls: another thread inside dlopen could be waiting for us to release it.
void* own_handle() {
  static std::atomic<void*> h{nullptr};
  if (void* v = h.load(std::memory_order_acquire)) return v;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&anchor), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* v = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  h.store(v, std::memory_order_release);  // stays open: we are never unloaded while hooks run
  return v;
}

// Already loaded libraries only (RTLD_NOLOAD): substitution never loads anything.
void* loaded(const char* soname) {
  void* h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (h != nullptr) dlclose(h);  // the library stays loaded by whoever loaded it
  return h;
}

void* runtime_symbol(void* lib, const char* name) {
  if (void* f = dlvsym(lib, name, "libcudart.so.13")) return f;
  return real_dlsym(lib, name);
}

// The lookups made here must not leave an error behind: a dlsym that found its symbol reports no
// error to a dlerror() that follows it, whatever we looked up on the way.
struct KeepDlerrorClear {
  ~KeepDlerrorClear() { (void)dlerror(); }
};

// Idempotent: threads racing here compute the same values.
bool resolve_driver() {
  if (g_driver_complete.load(std::memory_order_acquire)) return true;
  KeepDlerrorClear clear;
  void* self = own_handle();
  void* cuda = loaded("libcuda.so.1");
  if (self == nullptr || cuda == nullptr) return false;
  for (size_t i = 0; i < kDrivers; ++i) {
    g_driver[i].ours.store(real_dlsym(self, kDriverNames[i]), std::memory_order_relaxed);
    g_driver[i].real.store(real_dlsym(cuda, kDriverNames[i]), std::memory_order_relaxed);
  }
  g_driver_complete.store(true, std::memory_order_release);
  return true;
}

void* substitute(Pair& p, void* found) {
  void* real = p.real.load(std::memory_order_acquire);
  void* ours = p.ours.load(std::memory_order_acquire);
  return (found == real && ours != nullptr && ours != real) ? ours : found;
}

}  // namespace

void* substitute_driver_function(void* real) {
  if (real == nullptr || !resolve_driver()) return real;
  for (size_t i = 0; i < kDrivers; ++i)
    if (g_driver[i].real.load(std::memory_order_relaxed) == real) return substitute(g_driver[i], real);
  return real;
}

void* substitute_by_name(const char* name, void* found) {
  if (found == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u') return found;
  for (size_t i = 0; i < kDrivers; ++i) {
    if (std::strcmp(name, kDriverNames[i]) != 0) continue;
    if (!resolve_driver()) return found;
    return substitute(g_driver[i], found);
  }
  for (size_t i = 0; i < kRuntimes; ++i) {
    if (std::strcmp(name, kRuntimeNames[i]) != 0) continue;
    // libcudart may be loaded (or found) later than the first lookup: resolve per name, keep hits.
    if (g_runtime[i].real.load(std::memory_order_acquire) == nullptr) {
      KeepDlerrorClear clear;
      void* self = own_handle();
      void* rt = loaded("libcudart.so.13");
      if (self == nullptr || rt == nullptr) return found;
      g_runtime[i].ours.store(real_dlsym(self, name), std::memory_order_relaxed);
      g_runtime[i].real.store(runtime_symbol(rt, name), std::memory_order_release);
    }
    return substitute(g_runtime[i], found);
  }
  return found;
}

}  // namespace gpushim
