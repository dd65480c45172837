#include "cuda/real_symbols.h"

#include "front/front_api.h"
#include "util/dlopen_guard.h"
#include "util/thread_block.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <initializer_list>

namespace gpushim {
namespace {

using DlsymFn = void* (*)(void*, const char*);

// Never the front's dlsym (front/front_dlsym.cpp): it may end up here, so falling back to it would loop.
GPUSHIM_EARLY void* no_dlsym(void*, const char*) { return nullptr; }

// glibc 2.34 moved dlsym into libc and gave it a new version; older ones only have the base
// version of their architecture (2.2.5 on x86-64, 2.17 on aarch64).
GPUSHIM_EARLY DlsymFn find_real_dlsym() {
  if (void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")) return reinterpret_cast<DlsymFn>(f);
  if (void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5")) return reinterpret_cast<DlsymFn>(f);
  if (void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17")) return reinterpret_cast<DlsymFn>(f);
  return &no_dlsym;
}

// The preload front this library was loaded by (front/front_api.h); null when linked directly
// (the unit tests, gpushim-analyze).
std::atomic<const GpushimFront*> g_front{nullptr};

// dlvsym(lib, name, version) (version null: dlsym). RTLD_NEXT asked from the core, which the front
// loads outside the global scope, would search the wrong objects: the front asks for it.
void* lookup(void* lib, const char* name, const char* version) {
  const GpushimFront* front = g_front.load(std::memory_order_acquire);
  if (lib == RTLD_NEXT && front != nullptr) return front->next_symbol(name, version);
  return version != nullptr ? dlvsym(lib, name, version) : real_dlsym(lib, name);
}

// Is `f` defined by another gpushim front? A second install preloaded after ours (another
// checkout, a packaged copy; the launcher keeps a user's LD_PRELOAD) exports every runtime name
// unversioned, so an unversioned lookup past our front finds its trampolines before the runtime:
// they would load a second core that counts every call again and writes a second report (a
// review helper's reproducer: a runtime loaded with ctypes, or CUDA 12's). Such an object defines
// the public API itself; the core, which also does, is never in the global scope.
bool in_another_front(void* f) {
  Dl_info info, api;
  if (dladdr(f, &info) == 0 || info.dli_fname == nullptr) return false;
  void* h = guarded_dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return false;
  void* mark = real_dlsym(h, "gpushim_mark_iteration");
  const bool front = mark != nullptr && dladdr(mark, &api) != 0 && api.dli_fbase == info.dli_fbase;
  guarded_dlclose(h);
  (void)dlerror();  // our lookups, not the program's
  return front;
}

template <typename F>
void resolve(void* lib, F*& slot, const char* name) {
  // A versioned lookup first: it is what the application itself bound to (CUDA 13's runtime, else
  // 12's or 11's), and never another front's unversioned trampoline. A runtime of another version
  // node is found unversioned, or, past another front, not at all (resolve_real_runtime then
  // looks for libcudart.so.13 and .12 loaded locally).
  void* f = nullptr;
  for (const char* version : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"})
    if (f == nullptr) f = lookup(lib, name, version);
  if (f == nullptr && (f = lookup(lib, name, nullptr)) != nullptr && lib == RTLD_NEXT && in_another_front(f))
    f = nullptr;  // the runtime is further on, or loaded locally: resolve_real_runtime looks there
  slot = reinterpret_cast<F*>(f);
}

RealRuntime* resolve_runtime(void* lib) {
  auto* r = new RealRuntime;
  resolve(lib, r->cudaMalloc, "cudaMalloc");
  resolve(lib, r->cudaFree, "cudaFree");
  resolve(lib, r->cudaMallocAsync, "cudaMallocAsync");
  resolve(lib, r->cudaMallocAsync_ptsz, "cudaMallocAsync_ptsz");
  resolve(lib, r->cudaFreeAsync, "cudaFreeAsync");
  resolve(lib, r->cudaFreeAsync_ptsz, "cudaFreeAsync_ptsz");
  resolve(lib, r->cudaMallocPitch, "cudaMallocPitch");
  resolve(lib, r->cudaMallocManaged, "cudaMallocManaged");
  resolve(lib, r->cudaMallocHost, "cudaMallocHost");
  resolve(lib, r->cudaHostAlloc, "cudaHostAlloc");
  resolve(lib, r->cudaFreeHost, "cudaFreeHost");
  resolve(lib, r->cudaMemGetInfo, "cudaMemGetInfo");
  resolve(lib, r->cudaGetDevice, "cudaGetDevice");
  resolve(lib, r->cudaGetErrorName, "cudaGetErrorName");
  resolve(lib, r->cudaSetDevice, "cudaSetDevice");
  resolve(lib, r->cudaStreamIsCapturing, "cudaStreamIsCapturing");
  resolve(lib, r->cudaIpcGetMemHandle, "cudaIpcGetMemHandle");
  resolve(lib, r->cudaMemPoolGetAttribute, "cudaMemPoolGetAttribute");
  resolve(lib, r->cudaMemPoolSetAttribute, "cudaMemPoolSetAttribute");
  resolve(lib, r->cudaMemPoolTrimTo, "cudaMemPoolTrimTo");
  resolve(lib, r->cudaDeviceSetMemPool, "cudaDeviceSetMemPool");
  resolve(lib, r->cudaDeviceReset, "cudaDeviceReset");
  return r;
}

}  // namespace

// Not a function-local static: the first lookup may come from inside a library constructor, and a
// guard variable there could be re-entered. Racing threads store the same value.
DlsymFn g_real_dlsym_fn = nullptr;

void attach_front(const GpushimFront* front) {
  use_front_thread_block(front->thread_block_offset, front->thread_block_bytes);
  set_dlopen_guard(front->begin_dlopen, front->end_dlopen);
  __atomic_store_n(&g_real_dlsym_fn, front->real_dlsym, __ATOMIC_RELEASE);
  g_front.store(front, std::memory_order_release);
}

int register_fork_handlers(void (*prepare)(), void (*parent)(), void (*child)()) {
  if (const GpushimFront* front = g_front.load(std::memory_order_acquire); front != nullptr && front->atfork != nullptr)
    return front->atfork(prepare, parent, child);
  return pthread_atfork(prepare, parent, child);
}

GPUSHIM_EARLY void* real_dlsym_function() {
  DlsymFn fn = __atomic_load_n(&g_real_dlsym_fn, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    fn = find_real_dlsym();
    __atomic_store_n(&g_real_dlsym_fn, fn, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<void*>(fn);
}

GPUSHIM_EARLY void* real_dlsym(void* handle, const char* name) {
  return reinterpret_cast<DlsymFn>(real_dlsym_function())(handle, name);
}

std::atomic<const RealRuntime*> g_real_runtime{nullptr};

const RealRuntime& resolve_real_runtime() {
  // Resolved once libcudart is found, and looked for again until then: a process may call the
  // driver first (our driver hooks then run before any runtime exists) and load libcudart later.
  static const RealRuntime none;
  if (const RealRuntime* t = g_real_runtime.load(std::memory_order_acquire)) return *t;  // another thread was first
  // The runtime the application bound to: the next definition after us in the global scope.
  RealRuntime* r = resolve_runtime(RTLD_NEXT);
  if (r->cudaMalloc == nullptr) {
    // Not in the global scope: loaded with RTLD_LOCAL (ctypes.CDLL, or a plugin's dependency).
    // Its callers reach our hooks through dlsym on its handle (front/front_dlsym.cpp).
    delete r;
    void* lib = nullptr;
    for (const char* soname : {"libcudart.so.13", "libcudart.so.12"})  // CUDA 13's, else CUDA 12's
      if ((lib = guarded_dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) != nullptr) break;
    (void)dlerror();  // NOLOAD of a runtime that is not there is a lookup of ours, not the program's
    if (lib == nullptr) return none;
    r = resolve_runtime(lib);
    guarded_dlclose(lib);  // NOLOAD took a reference; the library stays loaded by whoever loaded it
    if (r->cudaMalloc == nullptr) {
      delete r;
      return none;
    }
  }
  const RealRuntime* expected = nullptr;
  if (!g_real_runtime.compare_exchange_strong(expected, r, std::memory_order_acq_rel)) {
    delete r;  // another thread won; identical contents
    return *expected;
  }
  return *r;
}

}  // namespace gpushim
