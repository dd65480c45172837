#include "hooks/substitution.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "cuda/hooked_symbols.h"
#include "cuda/real_symbols.h"
#include "util/dlopen_guard.h"

namespace gpushim {
namespace {

// Our hooks, by exported name (cuda/hooked_symbols.h): the driver's for cuGetProcAddress and a
// libcuda handle, the runtime's for dlsym on a libcudart handle (what
// ctypes.CDLL("libcudart.so.13").cudaMalloc does).
#define GPUSHIM_DRIVER_NAME(member, symbol, type) symbol,
constexpr const char* kDriverNames[] = {GPUSHIM_HOOKED_DRIVER_FUNCTIONS(GPUSHIM_DRIVER_NAME)};
#undef GPUSHIM_DRIVER_NAME
#define GPUSHIM_RUNTIME_NAME(symbol) symbol,
constexpr const char* kRuntimeNames[] = {GPUSHIM_HOOKED_RUNTIME_FUNCTIONS(GPUSHIM_RUNTIME_NAME)};
#undef GPUSHIM_RUNTIME_NAME
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
  void* v = guarded_dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  h.store(v, std::memory_order_release);  // stays open: we are never unloaded while hooks run
  return v;
}

// Already loaded libraries only (RTLD_NOLOAD): substitution never loads anything.
void* loaded(const char* soname) {
  void* h = guarded_dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (h != nullptr) guarded_dlclose(h);  // the library stays loaded by whoever loaded it
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
