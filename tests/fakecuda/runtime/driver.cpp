// How the runtime reaches the driver: exactly the route of NVIDIA's libcudart.so.13.
//   1. dlopen("libcuda.so.1", RTLD_NOW)
//   2. dlsym(handle, "cuGetProcAddress_v2") -- the only dlsym
//   3. a probe call with an empty name
//   4. cuGetProcAddress_v2("cuGetProcAddress", 12000) and, through the function that returns, every
//      other driver function by base name, ABI version and stream flags (FAKECUDART_DRIVER_FUNCTIONS)
//   5. cuDriverGetVersion and cuInit(0)
// An interposer that hooks dlsym or cuGetProcAddress therefore sees (and can wrap) everything.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "../misuse.h"
#include "runtime.h"

namespace fakecudart {
namespace {

DriverApi g_driver;
cudaError_t g_load_error = cudaSuccess;

cudaError_t Load() {
  // The handle is never closed: the driver lives as long as the process, as with the real runtime.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW);
  if (handle == nullptr) return cudaErrorInsufficientDriver;
  auto get_proc = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) return cudaErrorInsufficientDriver;

  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  get_proc("", &fn, kRuntimeVersion, 0, &status);  // probe, as the real runtime does first

  bool missing_required = false;
  auto resolve = [&](void** slot, const char* name, int version, cuuint64_t flags, bool required) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    if (get_proc(name, &p, version, flags, &st) != CUDA_SUCCESS || p == nullptr) {
      p = nullptr;
      if (required) missing_required = true;
    }
    *slot = p;
    // cuGetProcAddress itself comes first in the list: later lookups go through what it returned.
    if (slot == reinterpret_cast<void**>(&g_driver.cuGetProcAddress_v2) && p != nullptr) {
      get_proc = g_driver.cuGetProcAddress_v2;
    }
  };
#define FAKECUDART_RESOLVE(variant, name, version, flags, required) \
  resolve(reinterpret_cast<void**>(&g_driver.variant), name, version, flags, required);
  FAKECUDART_DRIVER_FUNCTIONS(FAKECUDART_RESOLVE)
#undef FAKECUDART_RESOLVE
  if (missing_required) return cudaErrorInsufficientDriver;

  int driver_version = 0;
  if (g_driver.cuDriverGetVersion(&driver_version) != CUDA_SUCCESS || driver_version < kRuntimeVersion) {
    return cudaErrorInsufficientDriver;
  }
  const CUresult r = g_driver.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) return cudaErrorNoDevice;
  if (r != CUDA_SUCCESS) return Translate(r);
  return cudaSuccess;
}

}  // namespace

// Set by the teardown that NVIDIA's runtime registers with atexit when it initializes: from then
// on (other atexit handlers, static destructors) every runtime call answers
// cudaErrorCudartUnloading instead of touching freed state.
std::atomic<bool> g_unloading{false};

namespace {

// NVIDIA's runtime frees the rest of its state with the library's static objects, which were made
// when it loaded and so are destroyed after every handler and static object of the program. A
// thread still calling the runtime then crashes inside it (an H200, 2026-11-27: e2e_exit_paths
// thread-exit, 4 runs of 4 with and without the shim, SIGSEGV in libcudart's cudaMalloc while the
// exiting thread ran __cxa_finalize). The simulated runtime stops the process there instead.
std::atomic<bool> g_destroyed{false};
struct RuntimeStatics {
  ~RuntimeStatics() { g_destroyed.store(true, std::memory_order_release); }
} g_runtime_statics;

[[noreturn]] void CalledAfterDestruction() {
  fakecuda::StopForMisuse(
      "a runtime call after the runtime's state was destroyed at exit (a thread still calling CUDA while the "
      "process exits: NVIDIA's runtime crashes here)");
}

}  // namespace

cudaError_t LoadDriver() {
  // Every runtime call passes here. libstdc++'s call_once goes through pthread_once and sets up
  // thread-local state on every call, done or not; NVIDIA's runtime checks a flag once it is
  // initialized, and so do we, so that the simulated runtime's own cost stays that small.
  static std::atomic<bool> loaded{false};
  if (!loaded.load(std::memory_order_acquire)) {
    static std::once_flag once;
    std::call_once(once, [] {
      g_load_error = Load();
      std::atexit([] {
        g_unloading.store(true);
        TeardownContexts();
      });
    });
    loaded.store(true, std::memory_order_release);
  }
  if (g_unloading.load(std::memory_order_relaxed)) {
    if (g_destroyed.load(std::memory_order_acquire)) CalledAfterDestruction();
    return cudaErrorCudartUnloading;
  }
  return g_load_error;
}

const DriverApi& Driver() { return g_driver; }

}  // namespace fakecudart
