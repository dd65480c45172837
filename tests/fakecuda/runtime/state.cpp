// Per-thread runtime state: current device, binding to the device's primary context, last error.
//
// As in CUDA: each thread has a current device (default 0). On a thread's first call that needs a
// device, the runtime uses the driver context current to the thread if there is one ("CUDA
// Runtime API calls operate on the CUDA Driver API CUcontext which is current to the calling host
// thread"; a context the program made with cuCtxCreate, say); only when none is does it retain
// that device's primary context (once per process) and make it current (cuCtxSetCurrent). cudaDeviceReset resets the primary context; every thread then
// rebinds on its next call, which the per-device generation counter detects.
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "runtime.h"

namespace fakecudart {
namespace {

constexpr int kMaxDevices = 64;

std::mutex g_mu;                     // guards g_primary
CUcontext g_primary[kMaxDevices];    // retained primary context per device
std::atomic<bool> g_release_at_teardown{false};  // fakecudaReleaseContextsAtTeardown
std::atomic<std::uint64_t> g_generation[kMaxDevices];
// Every primary context the runtime ever retained, kept across resets (a reset primary context
// keeps its handle; the simulated driver never reuses one): a thread finding one of these current
// and unusable rebinds it, where any other unusable context is one the program destroyed.
std::atomic<CUcontext> g_known_primary[kMaxDevices];

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;
thread_local bool t_bound = false;
thread_local std::uint64_t t_bound_generation = 0;

// fork() while another thread holds g_mu must not leave it locked in the child. Registered when
// the library is loaded (one thread, before any g_mu use): registered at the first Bind, a fork
// racing with another thread's first Bind could copy g_mu held with no handler to release it.
[[maybe_unused]] const bool g_fork_handlers =
    pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); }) == 0;

}  // namespace

cudaError_t PrimaryContext(int device, CUcontext* out) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  {
    std::lock_guard lk(g_mu);
    if (g_primary[device] != nullptr) {
      *out = g_primary[device];
      return cudaSuccess;
    }
  }
  // Retained without g_mu held: the driver's own lock is never taken under the runtime's, so the
  // fork handlers (each library's, run in reverse order of registration) cannot invert the order.
  CUcontext ctx = nullptr;
  if (CUresult r = Driver().cuDevicePrimaryCtxRetain(&ctx, device); r != CUDA_SUCCESS) return Translate(r);
  bool extra = false;
  {
    std::lock_guard lk(g_mu);
    if (g_primary[device] == nullptr) g_primary[device] = ctx;
    else extra = true;  // another thread retained it meanwhile
    *out = g_primary[device];
  }
  g_known_primary[device].store(ctx);
  if (extra) Driver().cuDevicePrimaryCtxRelease_v2(device);
  return cudaSuccess;
}

namespace {

bool KnownPrimary(CUcontext ctx) {
  for (const auto& primary : g_known_primary)
    if (primary.load() == ctx) return true;
  return false;
}

cudaError_t Bind(int device) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  const std::uint64_t generation = g_generation[device].load();
  CUcontext ctx = nullptr;
  if (cudaError_t e = PrimaryContext(device, &ctx); e != cudaSuccess) return e;
  if (CUresult r = Driver().cuCtxSetCurrent(ctx); r != CUDA_SUCCESS) return Translate(r);
  t_device = device;
  t_bound = true;
  t_bound_generation = generation;
  return cudaSuccess;
}

}  // namespace

cudaError_t Record(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

bool CurrentContextIsProgramMade() {
  CUcontext current = nullptr;
  return Driver().cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr && !KnownPrimary(current);
}

cudaError_t EnsureContext() {
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return e;
  if (t_bound && t_bound_generation == g_generation[t_device].load()) return cudaSuccess;
  // A context the program made current through the driver is the one runtime calls use: binding
  // the primary one over it handed the program memory of another context. A primary context the
  // runtime retained and that was reset since is replaced by the primary context, as before.
  CUcontext current = nullptr;
  CUdevice dev = 0;
  if (Driver().cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr) {
    const CUresult r = Driver().cuCtxGetDevice(&dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < kMaxDevices) {
      t_device = dev;
      t_bound = true;
      t_bound_generation = g_generation[dev].load();
      return cudaSuccess;
    }
    // Destroyed and unknown to the runtime: it stays current, and CUDA's runtime refuses under it
    // as every later call does ("invalid device context", as an H200 answered); binding the
    // primary context over it handed the thread memory CUDA refuses it. (A context made by the
    // program and destroyed by another thread still answers cuCtxGetDevice, as on the H200: the
    // runtime binds it above, and the driver refuses each call made in it.)
    if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED && !KnownPrimary(current)) return cudaErrorDeviceUninitialized;
  }
  return Bind(t_device);
}

cudaError_t SelectDevice(int device) {
  if (cudaError_t e = LoadDriver(); e != cudaSuccess) return e;
  int count = 0;
  if (CUresult r = Driver().cuDeviceGetCount(&count); r != CUDA_SUCCESS) return Translate(r);
  if (device < 0 || device >= count) return cudaErrorInvalidDevice;
  return Bind(device);
}

int CurrentDevice() {
  // The device of the context current to the thread, whichever made it current (cuCtxSetCurrent,
  // cuCtxPushCurrent after the thread's first runtime call): the runtime works in that context,
  // so cudaGetDevice names its device. A thread with none, or one that cannot answer (reset or
  // destroyed), has the device it selected. Callers loaded the driver.
  // The device of the context last asked about is kept per thread: a context's device never
  // changes, and the simulated driver never reuses a context's handle (user_contexts.cpp; a
  // primary context is its device's for good), while cuCtxGetDevice takes the driver's lock and
  // the shim asks cudaGetDevice at every cudaMalloc it serves.
  thread_local CUcontext t_seen_context = nullptr;
  thread_local int t_seen_device = 0;
  CUcontext current = nullptr;
  if (Driver().cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr) return t_device;
  if (current == t_seen_context) return t_seen_device;
  CUdevice dev = 0;
  if (Driver().cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0 || dev >= kMaxDevices) return t_device;
  t_seen_context = current;
  t_seen_device = dev;
  return dev;
}

void ForgetPrimaryContext(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard lk(g_mu);
  g_primary[device] = nullptr;
  ++g_generation[device];
}

void TeardownContexts() {
  if (!g_release_at_teardown.load()) return;
  for (int device = 0; device < kMaxDevices; ++device) {
    bool retained = false;
    {
      std::lock_guard lk(g_mu);
      retained = g_primary[device] != nullptr;
      g_primary[device] = nullptr;
    }
    // Outside g_mu, as PrimaryContext retains: the driver's lock is never taken under the runtime's.
    if (retained) Driver().cuDevicePrimaryCtxRelease_v2(device);
  }
}

}  // namespace fakecudart

using namespace fakecudart;

void fakecudaReleaseContextsAtTeardown(int on) { g_release_at_teardown.store(on != 0); }

cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return t_last_error; }
