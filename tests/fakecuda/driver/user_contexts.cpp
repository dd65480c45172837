// Contexts created by the program: cuCtxCreate_v4 and cuCtxDestroy_v2 (primary contexts are in
// context.cpp).
//
// A created context is a Context of its own on its device: its own streams, events and
// allocations, its own FAKECUDA_CONTEXT_MEM charge, pushed onto the creating thread's stack.
// Destroying it frees everything it owns, like a reset primary context, except stream-ordered
// memory, which belongs to its memory pool. Context objects are never
// deleted: another thread may still have the destroyed context current, and must get
// CUDA_ERROR_CONTEXT_IS_DESTROYED rather than touch freed memory.
#include "driver.h"

namespace fakecuda {
namespace {

// Guarded by State::mu.
std::vector<std::unique_ptr<Context>>& Created() {
  static auto* v = new std::vector<std::unique_ptr<Context>>;
  return *v;
}

constexpr unsigned kValidFlags = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX |
                                 CU_CTX_COREDUMP_ENABLE | CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS;

}  // namespace

Context* CreatedContextFromHandle(CUcontext h) {
  for (auto& c : Created()) {
    if (reinterpret_cast<CUcontext>(c.get()) == h && c->active) return c.get();
  }
  return nullptr;
}

std::vector<Context*> CreatedContexts() {
  std::vector<Context*> out;
  for (auto& c : Created())
    if (c->active) out.push_back(c.get());
  return out;
}

}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams, unsigned int flags, CUdevice dev) {
  CUcontext created = nullptr;
  {
    State& s = GetState();
    std::lock_guard lk(s.mu);
    Device* d = nullptr;
    if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
    if (pctx == nullptr || (flags & ~kValidFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
    const unsigned schedule = flags & CU_CTX_SCHED_MASK;
    if (schedule != CU_CTX_SCHED_AUTO && schedule != CU_CTX_SCHED_SPIN && schedule != CU_CTX_SCHED_YIELD &&
        schedule != CU_CTX_SCHED_BLOCKING_SYNC) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Execution affinity (SM partitions) and CUDA-in-graphics contexts need hardware the
    // simulated device does not have.
    if (ctxCreateParams != nullptr &&
        (ctxCreateParams->numExecAffinityParams != 0 || ctxCreateParams->cigParams != nullptr)) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (CUresult r = EnsureArena(*d); r != CUDA_SUCCESS) return r;
    if (CUresult r = ChargeDevice(*d, GetConfig().context_mem); r != CUDA_SUCCESS) return r;
    auto ctx = std::make_unique<Context>();
    ctx->device = dev;
    ctx->flags = flags;
    ctx->retain_count = 1;
    ctx->active = true;
    created = reinterpret_cast<CUcontext>(ctx.get());
    Created().push_back(std::move(ctx));
  }
  // Like CUDA, the new context becomes current on the creating thread.
  if (CUresult r = cuCtxPushCurrent_v2(created); r != CUDA_SUCCESS) {
    cuCtxDestroy_v2(created);
    return r;
  }
  *pctx = created;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  // Primary contexts are reset with cuDevicePrimaryCtxReset, never destroyed.
  for (auto& dev : s.devices) {
    if (reinterpret_cast<CUcontext>(&dev->primary) == ctx) return CUDA_ERROR_INVALID_CONTEXT;
  }
  Context* c = CreatedContextFromHandle(ctx);
  if (c == nullptr) BadHandle(s, "cuCtxDestroy_v2", HandleKind::kContext, reinterpret_cast<std::uintptr_t>(ctx));
  // Frees its streams, events and memory, but not stream-ordered memory ("cuCtxDestroy() will not
  // destroy memory allocations by cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()");
  // uncharges the context.
  DeactivateContext(s, lk, c, "cuCtxDestroy_v2", /*keep_pool_memory=*/true);
  BuryHandle(s, HandleKind::kContext, reinterpret_cast<std::uintptr_t>(ctx), "cuCtxDestroy_v2");
  lk.unlock();
  // Off the calling thread's stack if it is current there (other threads see it destroyed).
  CUcontext current = nullptr;
  if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx) {
    CUcontext popped = nullptr;
    cuCtxPopCurrent_v2(&popped);
  }
  return CUDA_SUCCESS;
}
