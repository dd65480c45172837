// Initialization, device queries and primary contexts.
//
// One primary context per device (what the runtime uses); contexts made with cuCtxCreate are in
// user_contexts.cpp. Each thread has a context stack like the real driver; cuCtxSetCurrent
// replaces its top.
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "driver.h"

namespace fakecuda {
namespace {

// Trivially destructible on purpose: exit() destroys the main thread's thread_local objects before
// static destructors run, and those may still call the driver (as they may with libcuda).
struct ContextStack {
  static constexpr int kMax = 64;
  Context* items[kMax];
  int depth = 0;
  bool empty() const { return depth == 0; }
  Context*& back() { return items[depth - 1]; }
  void pop_back() { --depth; }
  bool push_back(Context* c) {
    if (depth == kMax) return false;
    items[depth++] = c;
    return true;
  }
};
thread_local ContextStack t_context_stack;

// fork(): the child inherits our memory but none of the worker threads, so a child of a process
// that initialized the device must not use it (real CUDA behaves the same). Holding the state mutex
// across fork() guarantees that the child sees it unlocked and consistent, so it cannot deadlock.
// (The child unlocks what the forking thread locked in the prepare handler, rather than building
// a fresh mutex: ThreadSanitizer follows the lock through fork that way.) The handlers are
// registered when the library is loaded (g_state_at_load below), before any thread can take the
// mutex.
void AtForkPrepare() { GetState().mu.lock(); }
void AtForkParent() { GetState().mu.unlock(); }
void AtForkChild() {
  State& s = GetState();
  if (s.initialized) s.unusable_after_fork = true;
  s.mu.unlock();
}

CUresult ActivatePrimary(State& s, Device& dev) {
  Context& ctx = dev.primary;
  if (ctx.active) return CUDA_SUCCESS;
  if (CUresult r = EnsureArena(dev); r != CUDA_SUCCESS) return r;
  // FAKECUDA_CONTEXT_MEM: memory that no allocation call explains, like the real context's
  // code, local memory and heap reservations.
  if (CUresult r = ChargeDevice(dev, GetConfig().context_mem); r != CUDA_SUCCESS) return r;
  ctx.active = true;
  (void)s;
  return CUDA_SUCCESS;
}

}  // namespace

State& GetState() {
  static State* state = [] {
    auto* s = new State();
    const Config& cfg = GetConfig();
    for (int i = 0; i < cfg.devices; ++i) {
      auto dev = std::make_unique<Device>();
      dev->ordinal = i;
      dev->capacity = cfg.capacity;
      dev->primary.device = i;
      dev->default_pool.device = i;
      dev->default_pool.is_default = true;
      s->devices.push_back(std::move(dev));
    }
    // From the state's birth, not from cuInit: the mutex is taken before cuInit too (symbol
    // lookups while the runtime loads us), and a fork() while another thread held it then left
    // the child blocked forever on a lock nobody would release.
    pthread_atfork(AtForkPrepare, AtForkParent, AtForkChild);
    return s;
  }();
  return *state;
}

namespace {
// The state (and with it the fork handlers) comes to life when the library is loaded, by one
// thread: a fork can then never copy a half-built state (a C++ static-initialization guard left
// "in progress" by another thread would block the child's first driver call forever), nor happen
// while handlers are being registered.
[[maybe_unused]] const bool g_state_at_load = (GetState(), true);
}  // namespace

CUresult CheckInitialized(const State& s) {
  RefuseCallFromHostFunction();  // every driver call that needs the device passes here
  if (!s.initialized || s.unusable_after_fork) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

CUresult CurrentContext(State& s, Context** out) {
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (t_context_stack.empty() || t_context_stack.back() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Context* ctx = t_context_stack.back();
  // A primary context that was reset (or released to zero) stays current but is unusable until
  // it is retained again, which is what CUDA_ERROR_CONTEXT_IS_DESTROYED describes.
  if (!ctx->active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = ctx;
  return CUDA_SUCCESS;
}

CUresult GetDevice(State& s, CUdevice dev, Device** out) {
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (dev < 0 || dev >= static_cast<int>(s.devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  *out = s.devices[static_cast<std::size_t>(dev)].get();
  return CUDA_SUCCESS;
}

Device& DeviceOf(State& s, const Context* ctx) { return *s.devices[static_cast<std::size_t>(ctx->device)]; }

Context* ContextFromHandle(State& s, CUcontext h, const char* call) {
  for (auto& dev : s.devices) {
    if (reinterpret_cast<CUcontext>(&dev->primary) == h) return &dev->primary;
  }
  Context* c = CreatedContextFromHandle(h);
  if (c == nullptr) BadHandle(s, call, HandleKind::kContext, reinterpret_cast<std::uintptr_t>(h));
  return c;
}

void DeactivateContext(State& s, std::unique_lock<std::mutex>& lk, Context* ctx, const char* call,
                       bool keep_pool_memory) {
  if (!ctx->active) return;
  // Let queued work finish first: it may still write into memory we are about to release.
  SyncContext(s, lk, ctx);
  if (!ctx->active) return;  // another thread finished the job while we waited

  DropCapturesOfContext(s, ctx);
  std::vector<std::shared_ptr<Stream>> streams = ctx->streams;
  for (const auto& st : streams) RetireStream(s, st, call);
  ctx->legacy.reset();
  ctx->per_thread.clear();
  // Every handle of the context dies with it: later uses are misuse, as for an explicit destroy.
  auto bury_all = [&](auto& handles, HandleKind kind, auto&& owned) {
    for (auto it = handles.begin(); it != handles.end();) {
      if (!owned(*it->second)) {
        ++it;
        continue;
      }
      BuryHandle(s, kind, reinterpret_cast<std::uintptr_t>(it->first), call);
      it = handles.erase(it);
    }
  };
  bury_all(s.events, HandleKind::kEvent, [&](const Event& e) { return e.ctx == ctx; });
  bury_all(s.graph_execs, HandleKind::kGraphExec, [&](const GraphExec& e) { return e.ctx == ctx; });
  bury_all(s.graphs, HandleKind::kGraph, [&](const Graph& g) { return g.ctx == ctx; });
  for (auto it = s.arrays.begin(); it != s.arrays.end();) {  // their storage goes with the regions below
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    BuryHandle(s, it->second.levels != 0 ? HandleKind::kMipmappedArray : HandleKind::kArray, it->first, call);
    it = s.arrays.erase(it);
  }
  Device& device = DeviceOf(s, ctx);
  if (ctx == &device.primary) {
    // A device reset also destroys the memory pools the program created on the device.
    for (auto& [base, region] : s.regions) {
      if (region.pool != nullptr && !region.pool->is_default && region.pool->device == ctx->device) region.pool = nullptr;
    }
    device.current_pool = &device.default_pool;
    bury_all(s.pools, HandleKind::kMemPool, [&](const MemPool& p) { return p.device == ctx->device; });
  }
  std::vector<std::uintptr_t> owned;
  for (const auto& [base, region] : s.regions) {
    if (region.ctx == ctx && !(keep_pool_memory && region.kind == RegionKind::kDeviceAsync)) owned.push_back(base);
  }
  for (std::uintptr_t base : owned) ReleaseRegion(s, base);

  UnchargeDevice(device, GetConfig().context_mem);
  ctx->active = false;
}

}  // namespace fakecuda

using namespace fakecuda;

// ---------------------------------------------------------------------------------------------
// Initialization and versions
// ---------------------------------------------------------------------------------------------

CUresult CUDAAPI cuInit(unsigned int Flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (s.unusable_after_fork) return CUDA_ERROR_NOT_INITIALIZED;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = kDriverVersion;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Device* dev = nullptr;
  if (CUresult r = GetDevice(s, ordinal, &dev); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  *count = static_cast<int>(s.devices.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(len), "fakecuda simulated GPU %d", dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = d->capacity;
  return CUDA_SUCCESS;
}

namespace {
void FillUuid(CUuuid* uuid, CUdevice dev) {
  // Stable, recognisable UUID: "fakecuda" + device ordinal.
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, "fakecuda", 8);
  uuid->bytes[15] = static_cast<char>(dev);
}
}  // namespace

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FillUuid(uuid, dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(pciBusId, static_cast<std::size_t>(len), "0000:%02x:00.0", dev + 1);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  // Values of an H100-like part where tests or allocators might look; everything else reads 0.
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *pi = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *pi = 512; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = 2; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = dev + 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
      *pi = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: *pi = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; break;
    // Launch and occupancy limits of an H100 (SXM5), which real code divides by.
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 48 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = 227 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *pi = 228 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: *pi = 512; break;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH: *pi = 131072; break;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH: *pi = 131072; break;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH:
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT:
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH: *pi = 16384; break;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: *pi = 2; break;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: *pi = 134213632; break;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: *pi = 4; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH:
      *pi = 1;
      break;
    default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Primary contexts
// ---------------------------------------------------------------------------------------------

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = ActivatePrimary(s, *d); r != CUDA_SUCCESS) return r;
  ++d->primary.retain_count;
  *pctx = reinterpret_cast<CUcontext>(&d->primary);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (d->primary.retain_count <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d->primary.retain_count == 0) DeactivateContext(s, lk, &d->primary, "cuDevicePrimaryCtxRelease_v2");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  // Its retains stay: "Resetting the primary context does not release it, an application that has
  // retained the primary context should explicitly release its usage" (cuDevicePrimaryCtxReset).
  DeactivateContext(s, lk, &d->primary, "cuDevicePrimaryCtxReset_v2");
  return CUDA_SUCCESS;
}

// The CUDA 7-10 entry points, still exported by libcuda for programs built against them (and
// found by name through dlsym, as ctypes users do): the same behaviour here.
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = d->primary.flags;
  *active = d->primary.active ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  if (CUresult r = GetDevice(s, dev, &d); r != CUDA_SUCCESS) return r;
  d->primary.flags = flags;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Current context
// ---------------------------------------------------------------------------------------------

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  // The calling thread's own stack, read without the process-wide lock: the real driver answers
  // this from thread-local state too, one of its cheapest calls (the lock made it cost ~130
  // instructions here, which hot paths that ask it on every call paid and a GPU does not).
  const State& s = GetState();
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = t_context_stack.empty() ? nullptr : reinterpret_cast<CUcontext>(t_context_stack.back());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) {
    if (!t_context_stack.empty()) t_context_stack.pop_back();
    return CUDA_SUCCESS;
  }
  Context* c = ContextFromHandle(s, ctx, "cuCtxSetCurrent");
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_context_stack.empty()) {
    t_context_stack.push_back(c);
  } else {
    t_context_stack.back() = c;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  Context* c = ContextFromHandle(s, ctx, "cuCtxPushCurrent_v2");
  if (!t_context_stack.push_back(c)) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (t_context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(t_context_stack.back());
  t_context_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  // A context the program made and another thread destroyed, still current here: NVIDIA's driver
  // names its device (an H200, 2026-11-29: the shim took that for a live context and its pools
  // served memory there that CUDA refuses), while every call that uses the context refuses it.
  if (CheckInitialized(s) == CUDA_SUCCESS && !t_context_stack.empty() && t_context_stack.back() != nullptr &&
      !t_context_stack.back()->active && t_context_stack.back() != &DeviceOf(s, t_context_stack.back()).primary) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *device = t_context_stack.back()->device;
    return CUDA_SUCCESS;
  }
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  ++s.device_syncs;
  SyncContext(s, lk, ctx);
  return CUDA_SUCCESS;
}
