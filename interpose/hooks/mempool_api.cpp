// The memory-pool API, runtime and driver: calls on a device's default pool are answered by the
// core (core/shim_driver.cpp) when its pool serves that device; everything else goes to CUDA, and
// the core hears of the trims and destructions of CUDA's pools, whose reservations it holds.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <optional>

#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/error_codes.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "cuda/runtime_last_error.h"
#include "hooks/export.h"

using gpushim::real_driver;
using gpushim::real_runtime;
using gpushim::Shim;

namespace {

// The runtime's answer for a call the core served: errors stick as the runtime's last error.
cudaError_t runtime_answer(CUresult r) {
  const cudaError_t err = gpushim::to_runtime_error(r);
  if (err != cudaSuccess) gpushim::set_runtime_last_error(err);
  return err;
}

// The shim, when a driver call is ours to answer: not when the real runtime makes it for one of
// our runtime hooks (which answered already, or forwards on purpose).
Shim* driver_shim(const gpushim::CallScope& scope) { return scope.nested_in_runtime_hook() ? nullptr : Shim::get(); }

template <typename F, typename... Args>
CUresult call(F* real, Args... args) {
  return real ? real(args...) : CUDA_ERROR_NOT_INITIALIZED;
}

template <typename F, typename... Args>
cudaError_t call_runtime(F* real, Args... args) {
  return real ? real(args...) : cudaErrorInitializationError;
}

}  // namespace

#define GPUSHIM_RUNTIME_SCOPE gpushim::CallScope scope(gpushim::HookApi::kRuntime, __builtin_return_address(0))
#define GPUSHIM_DRIVER_SCOPE gpushim::CallScope scope(gpushim::HookApi::kDriver, __builtin_return_address(0))

// ---- runtime ----

GPUSHIM_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  GPUSHIM_RUNTIME_SCOPE;
  if (Shim* s = Shim::get())
    if (auto r = s->mempool_get_attribute(pool, static_cast<CUmemPool_attribute>(attr), value))
      return runtime_answer(*r);
  const cudaError_t err = call_runtime(real_runtime().cudaMemPoolGetAttribute, pool, attr, value);
  if (err == cudaSuccess)
    if (Shim* s = Shim::get()) s->mempool_read_by_program(pool, static_cast<CUmemPool_attribute>(attr), value);
  return err;
}

GPUSHIM_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  GPUSHIM_RUNTIME_SCOPE;
  if (Shim* s = Shim::get())
    if (auto r = s->mempool_set_attribute(pool, static_cast<CUmemPool_attribute>(attr), value))
      return runtime_answer(*r);
  return call_runtime(real_runtime().cudaMemPoolSetAttribute, pool, attr, value);
}

GPUSHIM_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep) {
  GPUSHIM_RUNTIME_SCOPE;
  Shim* s = Shim::get();
  if (s)
    if (auto r = s->mempool_trim_to(pool, minBytesToKeep)) return runtime_answer(*r);
  const cudaError_t err = call_runtime(real_runtime().cudaMemPoolTrimTo, pool, minBytesToKeep);
  if (err == cudaSuccess && s) s->mempool_trimmed(pool);
  return err;
}

GPUSHIM_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  GPUSHIM_RUNTIME_SCOPE;
  const cudaError_t err = call_runtime(real_runtime().cudaDeviceSetMemPool, device, pool);
  if (err == cudaSuccess)
    if (Shim* s = Shim::get()) s->mempool_current_set(device, pool);
  return err;
}

// ---- driver ----

GPUSHIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  GPUSHIM_DRIVER_SCOPE;
  Shim* s = driver_shim(scope);
  if (s)
    if (auto r = s->mempool_get_attribute(pool, attr, value)) return *r;
  const CUresult r = call(real_driver().cuMemPoolGetAttribute, pool, attr, value);
  if (r == CUDA_SUCCESS && s) s->mempool_read_by_program(pool, attr, value);
  return r;
}

GPUSHIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  GPUSHIM_DRIVER_SCOPE;
  if (Shim* s = driver_shim(scope))
    if (auto r = s->mempool_set_attribute(pool, attr, value)) return *r;
  return call(real_driver().cuMemPoolSetAttribute, pool, attr, value);
}

GPUSHIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  GPUSHIM_DRIVER_SCOPE;
  Shim* s = driver_shim(scope);
  if (s)
    if (auto r = s->mempool_trim_to(pool, minBytesToKeep)) return *r;
  const CUresult r = call(real_driver().cuMemPoolTrimTo, pool, minBytesToKeep);
  if (r == CUDA_SUCCESS && s) s->mempool_trimmed(pool);
  return r;
}

GPUSHIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  GPUSHIM_DRIVER_SCOPE;
  // The runtime's cudaMemPoolDestroy reaches this hook too (it is not hooked itself): forgotten
  // here whichever way the program destroyed it.
  auto forward = [&] { return call(real_driver().cuMemPoolDestroy, pool); };
  Shim* s = Shim::get();
  return s ? s->mempool_destroy(pool, forward) : forward();
}

GPUSHIM_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  GPUSHIM_DRIVER_SCOPE;
  // CUDA's first (it decides every error, and keeps its default pool's access for what it still
  // serves); the runtime's cudaMemPoolSetAccess reaches this hook too. Then our pool of that
  // device gives the same access to its own memory.
  const CUresult r = call(real_driver().cuMemPoolSetAccess, pool, map, count);
  if (r == CUDA_SUCCESS && map != nullptr)
    if (Shim* s = Shim::get()) s->mempool_access_set(pool, map, count);
  return r;
}

GPUSHIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  GPUSHIM_DRIVER_SCOPE;
  // The current context's device may now use peerContext's memory: for cuMemAlloc's that is
  // all, for the vmm pool's mappings of that device it takes cuMemSetAccess (the runtime's
  // cudaDeviceEnablePeerAccess reaches this hook too).
  const CUresult r = call(real_driver().cuCtxEnablePeerAccess, peerContext, Flags);
  if (r == CUDA_SUCCESS)
    if (Shim* s = Shim::get()) s->peer_access_changed(peerContext, true);
  return r;
}

GPUSHIM_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  GPUSHIM_DRIVER_SCOPE;
  // And taken back: what cudaMemPoolSetAccess gave the device stays (the stronger of the two).
  const CUresult r = call(real_driver().cuCtxDisablePeerAccess, peerContext);
  if (r == CUDA_SUCCESS)
    if (Shim* s = Shim::get()) s->peer_access_changed(peerContext, false);
  return r;
}

GPUSHIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  GPUSHIM_DRIVER_SCOPE;
  const CUresult r = call(real_driver().cuDeviceSetMemPool, dev, pool);
  // CUdevice is the device's ordinal.
  if (r == CUDA_SUCCESS)
    if (Shim* s = driver_shim(scope)) s->mempool_current_set(static_cast<int>(dev), pool);
  return r;
}
