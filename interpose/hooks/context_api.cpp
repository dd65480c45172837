// Calls that free every allocation of a device's primary context: cudaDeviceReset,
// cuDevicePrimaryCtxReset, and the cuDevicePrimaryCtxRelease that drops its last reference; and
// cuCtxDestroy, which frees what was allocated in a context the program created. The
// core must hear of a reset before it happens (its pool gives back memory that still exists) and
// of a destruction once the driver says it happened (only the driver knows the reference count).
// And the calls that make a context other than a primary one (cuCtxCreate, cuCtxFromGreenCtx):
// until one does, no stream can belong to another context than its device's pool's, and the pools
// skip asking (cuda/stream_registry.h, program_contexts_made).
#define __CUDA_API_VERSION_INTERNAL 1  // every variant (_v2) under its real name
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/destroyed_contexts.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "cuda/stream_registry.h"
#include "hooks/driver_hook.h"

using gpushim::real_driver;
using gpushim::real_runtime;
using gpushim::Shim;
using gpushim::driver_hook::accounting;
using gpushim::driver_hook::call;

GPUSHIM_EXPORT cudaError_t cudaDeviceReset(void) {
  gpushim::CallScope scope(gpushim::HookApi::kRuntime, __builtin_return_address(0));
  const gpushim::RealRuntime& rt = real_runtime();
  if (rt.cudaDeviceReset == nullptr) return cudaErrorInitializationError;
  Shim* s = Shim::get();
  int device = -1;
  if (s == nullptr || rt.cudaGetDevice == nullptr || rt.cudaGetDevice(&device) != cudaSuccess)
    return rt.cudaDeviceReset();
  s->before_device_reset(device);
  const cudaError_t err = rt.cudaDeviceReset();
  if (err == cudaSuccess) s->after_device_reset(device);
  return err;
}

namespace {

// `scope`: the exported hook's, which knows its caller.
CUresult reset_primary(CUresult (*real)(CUdevice), CUdevice dev, const gpushim::CallScope& scope) {
  Shim* s = accounting(scope);  // null inside cudaDeviceReset: that hook does the work
  if (s) s->before_device_reset(dev);
  const CUresult r = call(real, dev);
  if (s && r == CUDA_SUCCESS) s->after_device_reset(dev);
  return r;
}

CUresult release_primary(CUresult (*real)(CUdevice), CUdevice dev, const gpushim::CallScope& scope) {
  // Its handle, while it exists: if this release destroys it, its streams go with it.
  const CUcontext primary = gpushim::primary_context_if_active(dev);
  Shim* s = accounting(scope);
  // The runtime's own release (its teardown at exit, after which the exit report still lists
  // what the program leaked) is not the program destroying its context; only CUDA's pools end.
  if (s != nullptr && s->called_by_cuda()) return s->runtime_release(dev, [&] { return call(real, dev); });
  // What it owns must be asked while it exists (only the driver knows whether this release is
  // its last): the memory of other contexts, and cuMemCreate's, outlives it.
  std::vector<Shim::OwnedAllocation> owned;
  if (s != nullptr && primary != nullptr) owned = s->owned_by_context(primary, /*pool_memory=*/true);
  const CUresult r = call(real, dev);
  // A context inactive before the call (reset, which keeps the retains its users then give back)
  // ends with nothing.
  if (s == nullptr || r != CUDA_SUCCESS || primary == nullptr) return r;
  unsigned flags = 0;
  int active = 1;
  if (call(real_driver().cuDevicePrimaryCtxGetState, dev, &flags, &active) == CUDA_SUCCESS && active == 0)
    s->after_context_destroyed(dev, primary, owned);
  return r;
}

}  // namespace

GPUSHIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  GPUSHIM_SCOPE;
  return reset_primary(real_driver().cuDevicePrimaryCtxReset_v2, dev, scope);
}

GPUSHIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  GPUSHIM_SCOPE;
  return release_primary(real_driver().cuDevicePrimaryCtxRelease_v2, dev, scope);
}

// The CUDA 7-10 entry points, still exported by libcuda for programs built against them (and
// found by their plain names with dlsym): they free the same memory.
GPUSHIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  GPUSHIM_SCOPE;
  return reset_primary(real_driver().cuDevicePrimaryCtxReset_v1, dev, scope);
}

GPUSHIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  GPUSHIM_SCOPE;
  return release_primary(real_driver().cuDevicePrimaryCtxRelease_v1, dev, scope);
}

namespace {

// What the context owns must be asked before it is gone; the books change only if it is.
CUresult destroy_context(CUresult (*real)(CUcontext), CUcontext ctx) {
  GPUSHIM_SCOPE;
  Shim* s = accounting(scope);
  if (s == nullptr) return call(real, ctx);
  // A primary context is reset, not destroyed: CUDA refuses (CUDA_ERROR_INVALID_CONTEXT) and its
  // streams live on, so the pools must go on fencing them. Should a driver destroy it after all,
  // it is the end a last release makes.
  if (const int device = gpushim::device_of_primary_context(ctx); device >= 0) {
    const auto owned = s->owned_by_context(ctx, /*pool_memory=*/true);
    const CUresult r = call(real, ctx);
    if (r == CUDA_SUCCESS) s->after_context_destroyed(device, ctx, owned);
    return r;
  }
  const auto owned = s->owned_by_context(ctx);
  s->before_context_destroy(ctx);
  // Listed before the call: a context another thread makes once the driver let go of the handle
  // must find it listed already, to take it off (a review's race).
  const bool listed = gpushim::note_context_destroying(ctx);
  const CUresult r = call(real, ctx);
  if (r == CUDA_SUCCESS) s->after_context_destroy(owned);
  else if (listed) gpushim::note_context_alive(ctx);
  return r;
}

}  // namespace

GPUSHIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return destroy_context(real_driver().cuCtxDestroy_v2, ctx); }

// The CUDA 3.x entry point, still exported by libcuda for programs built against it.
GPUSHIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return destroy_context(real_driver().cuCtxDestroy_v1, ctx); }

namespace {

// Told before the call returns the context, so that no stream of it is ever used unnoticed.
template <typename F, typename... Args>
CUresult create_context(F* real, CUcontext* pctx, Args... args) {
  gpushim::note_program_context();
  const CUresult r = call(real, pctx, args...);
  if (r == CUDA_SUCCESS && pctx != nullptr) gpushim::note_context_alive(*pctx);
  return r;
}

}  // namespace

GPUSHIM_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  return create_context(real_driver().cuCtxCreate_v4, pctx, params, flags, dev);
}
GPUSHIM_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int count, unsigned int flags,
                                       CUdevice dev) {
  return create_context(real_driver().cuCtxCreate_v3, pctx, params, count, flags, dev);
}
GPUSHIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return create_context(real_driver().cuCtxCreate_v2, pctx, flags, dev);
}
// The CUDA 3.x entry point, still exported by libcuda for programs built against it.
GPUSHIM_EXPORT CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return create_context(real_driver().cuCtxCreate_v1, pctx, flags, dev);
}
GPUSHIM_EXPORT CUresult cuCtxFromGreenCtx(CUcontext* pctx, CUgreenCtx green) {
  return create_context(real_driver().cuCtxFromGreenCtx, pctx, green);
}
