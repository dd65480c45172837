#include "cuda/driver_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <memory>

#include "cuda/capture_state.h"
#include "cuda/destroyed_contexts.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "cuda/stream_registry.h"
#include "util/log.h"
#include "util/dlopen_guard.h"

namespace gpushim {

namespace {

// An event handle of this backend is a CUevent of the primary context, or, with its lowest bit
// set, a heap TailRef of another context (foreign_stream). CUevents are aligned pointers (the
// simulated driver's handles end in four zero bits). The low bit, not a high one: the handle is
// then still a pointer into the TailRef, which keeps it reachable for leak checkers while a
// block holds it (the pools live until the process ends; ASan reported each one as leaked).
constexpr uint64_t kMarkBit = 1;
bool is_mark(uint64_t event) { return (event & kMarkBit) != 0; }
TailRef* mark_of(uint64_t event) { return reinterpret_cast<TailRef*>(event & ~kMarkBit); }

}  // namespace

struct DriverApi {
  decltype(&cuMemAlloc_v2) mem_alloc = nullptr;
  decltype(&cuMemFree_v2) mem_free = nullptr;
  decltype(&cuMemGetInfo_v2) mem_get_info = nullptr;
  decltype(&cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&cuCtxGetDevice) ctx_get_device = nullptr;  // optional: a destroyed context is then not told apart
  decltype(&cuCtxPushCurrent_v2) ctx_push = nullptr;
  decltype(&cuCtxPopCurrent_v2) ctx_pop = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) primary_retain = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuEventCreate) event_create = nullptr;
  decltype(&cuEventRecord) event_record = nullptr;
  decltype(&cuEventQuery) event_query = nullptr;
  decltype(&cuEventDestroy_v2) event_destroy = nullptr;
  decltype(&cuEventSynchronize) event_synchronize = nullptr;  // optional: fences are then never waited for
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
};

namespace {

template <typename F>
void load(void* lib, F& slot, const char* name) {
  slot = reinterpret_cast<F>(real_dlsym(lib, name));
}

}  // namespace

const DriverApi* driver_api() {
  static const DriverApi* api = []() -> const DriverApi* {
    void* lib = guarded_dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      log_line("cannot load libcuda.so.1 (%s); device memory will not be pooled", dlerror());
      return nullptr;
    }
    // Idempotent; the runtime normally did it already, but pools may run before it touched the driver.
    if (auto init = reinterpret_cast<decltype(&cuInit)>(real_dlsym(lib, "cuInit"))) init(0);
    auto* a = new DriverApi;
    load(lib, a->mem_alloc, "cuMemAlloc_v2");
    load(lib, a->mem_free, "cuMemFree_v2");
    load(lib, a->mem_get_info, "cuMemGetInfo_v2");
    load(lib, a->ctx_synchronize, "cuCtxSynchronize");
    load(lib, a->ctx_get_current, "cuCtxGetCurrent");
    load(lib, a->ctx_get_device, "cuCtxGetDevice");
    load(lib, a->ctx_push, "cuCtxPushCurrent_v2");
    load(lib, a->ctx_pop, "cuCtxPopCurrent_v2");
    load(lib, a->primary_retain, "cuDevicePrimaryCtxRetain");
    load(lib, a->device_get, "cuDeviceGet");
    load(lib, a->event_create, "cuEventCreate");
    load(lib, a->event_record, "cuEventRecord");
    load(lib, a->event_query, "cuEventQuery");
    load(lib, a->event_destroy, "cuEventDestroy_v2");
    load(lib, a->event_synchronize, "cuEventSynchronize");
    load(lib, a->granularity, "cuMemGetAllocationGranularity");
    load(lib, a->address_reserve, "cuMemAddressReserve");
    load(lib, a->address_free, "cuMemAddressFree");
    load(lib, a->create, "cuMemCreate");
    load(lib, a->release, "cuMemRelease");
    load(lib, a->map, "cuMemMap");
    load(lib, a->unmap, "cuMemUnmap");
    load(lib, a->set_access, "cuMemSetAccess");
    if (!a->mem_alloc || !a->mem_free || !a->ctx_synchronize || !a->ctx_get_current || !a->ctx_push ||
        !a->ctx_pop || !a->primary_retain || !a->device_get || !a->event_create || !a->event_record ||
        !a->event_query || !a->event_destroy || !a->mem_get_info) {
      log_line("libcuda.so.1 lacks functions the pools need; device memory will not be pooled");
      return nullptr;
    }
    return a;
  }();
  return api;
}

// What a fence waits for: its own events (legacy stream and every live non-blocking stream), and
// the tails of streams destroyed before it that had not finished yet.
struct DeviceFence {
  std::vector<CUevent> events;
  std::vector<TailRef> tails;
};

DriverBackend::DriverBackend(int device) : device_(device), api_(driver_api()) {}

DriverBackend::CurrentContext DriverBackend::current_context() {
  if (api_ == nullptr) return CurrentContext::kPools;
  CUcontext current = nullptr;
  // No context: the runtime's call would bind the primary one, and so does the shim
  // (Shim::bind_thread_context). An error here is the pool's to meet and report.
  if (api_->ctx_get_current(&current) != CUDA_SUCCESS || current == nullptr) return CurrentContext::kPools;
  // Compared without retaining: a program that works only in its own context never asked for the
  // primary one (device memory, and time), and CUDA's runtime does not make it there.
  CUcontext primary = primary_.load(std::memory_order_acquire);
  if (primary == nullptr) primary = primary_context_if_active(device_);
  if (current == primary) return CurrentContext::kPools;
  // Destroyed by another thread, it stays current here, and CUDA refuses every allocation and free
  // under it. A real driver still answers cuCtxGetDevice there (an H200, 2026-11-29): the shim's
  // own list says it (cuda/destroyed_contexts.h). A context that refuses cuCtxGetDevice cannot use
  // memory either.
  if (context_known_destroyed(current)) return CurrentContext::kDestroyed;
  CUdevice dev = 0;
  if (api_->ctx_get_device != nullptr && api_->ctx_get_device(&dev) != CUDA_SUCCESS) return CurrentContext::kDestroyed;
  return CurrentContext::kProgramsOwn;
}

template <typename F>
CUresult DriverBackend::in_context(F&& fn) {
  // Retained on first use, not at construction: a device first seen through the driver API may be
  // used with the program's own context, and retaining would create a primary context it never
  // asked for (device memory, and time).
  CUcontext primary = primary_.load(std::memory_order_acquire);
  if (primary == nullptr) {
    std::lock_guard<std::mutex> lock(retain_mu_);
    primary = primary_.load(std::memory_order_relaxed);
    CUdevice dev;
    if (primary == nullptr && api_ != nullptr) {
      retain_result_ = api_->device_get(&dev, device_);
      if (retain_result_ == CUDA_SUCCESS) retain_result_ = api_->primary_retain(&primary, dev);
      if (retain_result_ != CUDA_SUCCESS) primary = nullptr;
      primary_.store(primary, std::memory_order_release);
    }
    // The driver's own reason (e.g. CUDA_ERROR_NOT_INITIALIZED in a fork child), so the caller
    // gets the code the real runtime would have given.
    if (primary == nullptr) return retain_result_ != CUDA_SUCCESS ? retain_result_ : CUDA_ERROR_INVALID_CONTEXT;
  }
  CUcontext cur = nullptr;
  api_->ctx_get_current(&cur);
  if (cur == primary) return fn();
  if (api_->ctx_push(primary) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
  const CUresult r = fn();
  CUcontext popped;
  api_->ctx_pop(&popped);
  return r;
}

void DriverBackend::forget_context() {
  {
    // A reset ends the default pool's access settings and the peer links with the context: the
    // program grants them again.
    std::lock_guard<std::mutex> access(access_mu_);
    peers_.clear();
  }
  std::lock_guard<std::mutex> lock(retain_mu_);
  primary_.store(nullptr, std::memory_order_release);
  retain_result_ = CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> events(events_mu_);
  spare_events_.clear();  // destroyed with the context: never to be recorded again
}

CUresult DriverBackend::segment_alloc(size_t bytes, void** out) {
  return in_context([&] {
    CUdeviceptr p = 0;
    const CUresult r = api_->mem_alloc(&p, bytes);
    *out = reinterpret_cast<void*>(p);
    return r;
  });
}

CUresult DriverBackend::segment_free(void* p, size_t) {
  return in_context([&] { return api_->mem_free(reinterpret_cast<CUdeviceptr>(p)); });
}

CUresult DriverBackend::synchronize() {
  const CUresult r = in_context([&] { return api_->ctx_synchronize(); });
  // The primary context's streams have finished, destroyed ones' too. Tails of other contexts'
  // destroyed streams are dropped as well, though their work may still run: otherwise an unknown
  // one would never clear (docs/policies.md, "Streams of program-made contexts and the pools'
  // synchronization": those tails only order plain frees, which CUDA leaves to the program).
  if (r == CUDA_SUCCESS) tails_settled(device_);
  return r;
}

uint64_t DriverBackend::record_device_fence() {
  auto fence = std::make_unique<DeviceFence>();
  // The legacy stream's event already waits for every blocking stream of its context (CUDA's
  // legacy stream rules); non-blocking ones are recorded under the registry's lock, so that none
  // can be destroyed between being listed and being recorded on.
  auto record = [&](CUstream s) {
    const uint64_t e = record_event(s);
    if (e != 0) fence->events.push_back(reinterpret_cast<CUevent>(e));
    return e != 0;  // e.g. a stream of a context other than the primary one: cannot be proven here
  };
  // After the legacy stream's event, which retained the primary context if need be.
  if (!record(CU_STREAM_LEGACY) ||
      !record_fence_targets(device_, primary_.load(std::memory_order_acquire), record, &fence->tails)) {
    release_fence(reinterpret_cast<uint64_t>(fence.release()));
    return 0;
  }
  return reinterpret_cast<uint64_t>(fence.release());
}

bool DriverBackend::fence_done(uint64_t f) {
  auto* fence = reinterpret_cast<DeviceFence*>(f);
  // Done events are dropped as they are seen, so a fence polled many times asks each event once.
  while (!fence->events.empty()) {
    if (!event_done(reinterpret_cast<uint64_t>(fence->events.back()))) return false;
    release_event(reinterpret_cast<uint64_t>(fence->events.back()));
    fence->events.pop_back();
  }
  while (!fence->tails.empty()) {
    if (!tail_done(fence->tails.back())) return false;
    fence->tails.pop_back();
  }
  return true;
}

bool DriverBackend::wait_fence(uint64_t f) {
  if (api_->event_synchronize == nullptr) return false;
  auto* fence = reinterpret_cast<DeviceFence*>(f);
  for (CUevent e : fence->events)
    if (api_->event_synchronize(e) != CUDA_SUCCESS) return false;
  for (const auto& t : fence->tails)
    if (!wait_tail(t)) return false;
  return true;
}

void DriverBackend::release_fence(uint64_t f) {
  auto* fence = reinterpret_cast<DeviceFence*>(f);
  for (CUevent e : fence->events) release_event(reinterpret_cast<uint64_t>(e));
  release_fence_tails(&fence->tails);
  delete fence;
}

uint64_t DriverBackend::record_event(CUstream stream) {
  CUevent e = nullptr;
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    if (!spare_events_.empty()) {
      e = spare_events_.back();
      spare_events_.pop_back();
    }
  }
  const CUresult r = in_context([&] {
    if (e == nullptr && api_->event_create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
    return api_->event_record(e, stream);
  });
  if (r != CUDA_SUCCESS) {
    if (e) release_event(reinterpret_cast<uint64_t>(e));
    return 0;
  }
  return reinterpret_cast<uint64_t>(e);
}

bool DriverBackend::foreign_stream(CUstream stream, uint64_t* event) {
  if (!program_contexts_made()) return false;  // the pools ask foreign_streams_possible() first
  const CUcontext primary = primary_.load(std::memory_order_acquire);
  if (primary == nullptr) return false;  // no segment yet: nothing a stream could order
  CUcontext ctx = nullptr;
  if (names_created_stream(stream)) ctx = context_of_stream(stream);
  else if (api_->ctx_get_current(&ctx) != CUDA_SUCCESS) ctx = nullptr;
  // A context unknown (a stream made where no hook saw it, on a driver without cuStreamGetCtx)
  // is taken for the primary one, as before contexts were told apart.
  if (ctx == nullptr || ctx == primary) return false;
  if (event != nullptr) {
    TailRef mark = record_mark(stream, ctx);
    *event = mark == nullptr ? 0 : reinterpret_cast<uint64_t>(new TailRef(std::move(mark))) | kMarkBit;
  }
  return true;
}

bool DriverBackend::synchronize_covers(uint64_t event) { return !is_mark(event); }

const std::atomic<bool>* DriverBackend::foreign_streams_possible() { return program_contexts_flag(); }

bool DriverBackend::event_on_callers_stream(uint64_t event, CUstream stream) {
  // A per-thread default stream is one thread's as well: the mark knows which (a program working
  // in its own context on cudaStreamPerThread failed at the cap, e2e program_ctx_only_per_thread).
  if (!is_mark(event) || (stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD)) return false;
  CUcontext ctx = nullptr;
  return api_->ctx_get_current(&ctx) == CUDA_SUCCESS && mark_on_default_stream_of(*mark_of(event), stream, ctx);
}

bool DriverBackend::event_done(uint64_t event) {
  if (is_mark(event)) return tail_done(*mark_of(event));
  return api_->event_query(reinterpret_cast<CUevent>(event)) == CUDA_SUCCESS;
}

void DriverBackend::release_event(uint64_t event) {
  if (is_mark(event)) {
    release_mark(*mark_of(event));
    delete mark_of(event);
    return;
  }
  std::lock_guard<std::mutex> lock(events_mu_);
  spare_events_.push_back(reinterpret_cast<CUevent>(event));
}

bool DriverBackend::capture_active() { return active_captures().load(std::memory_order_acquire) > 0; }

CUresult DriverBackend::mem_info(size_t* free, size_t* total) {
  return in_context([&] { return api_->mem_get_info(free, total); });
}

size_t DriverBackend::granularity() {
  if (!api_->granularity) return 0;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  size_t g = 0;
  if (api_->granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS) return 0;
  return g;
}

CUresult DriverBackend::va_reserve(size_t size, uintptr_t hint, uintptr_t* out) {
  if (!api_->address_reserve) return CUDA_ERROR_NOT_SUPPORTED;
  return in_context([&] {
    CUdeviceptr p = 0;
    const CUresult r = api_->address_reserve(&p, size, 0, static_cast<CUdeviceptr>(hint), 0);
    *out = static_cast<uintptr_t>(p);
    return r;
  });
}

CUresult DriverBackend::va_free(uintptr_t va, size_t size) {
  if (!api_->address_free) return CUDA_ERROR_NOT_SUPPORTED;
  return in_context([&] { return api_->address_free(static_cast<CUdeviceptr>(va), size); });
}

CUresult DriverBackend::physical_create(size_t size, uint64_t* handle) {
  if (!api_->create) return CUDA_ERROR_NOT_SUPPORTED;
  return in_context([&] {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = api_->create(&h, size, &prop, 0);
    *handle = static_cast<uint64_t>(h);
    return r;
  });
}

CUresult DriverBackend::physical_release(uint64_t handle, size_t) {
  if (!api_->release) return CUDA_ERROR_NOT_SUPPORTED;
  return in_context([&] { return api_->release(static_cast<CUmemGenericAllocationHandle>(handle)); });
}

CUresult DriverBackend::map(uintptr_t va, size_t size, uint64_t handle, size_t offset) {
  if (!api_->map || !api_->set_access) return CUDA_ERROR_NOT_SUPPORTED;
  return in_context([&] {
    std::lock_guard<std::mutex> lock(access_mu_);
    CUresult r = api_->map(static_cast<CUdeviceptr>(va), size, offset, static_cast<CUmemGenericAllocationHandle>(handle), 0);
    if (r != CUDA_SUCCESS) return r;
    std::vector<CUmemAccessDesc> access(1);
    access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[0].location.id = device_;
    access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (const auto& [peer, a] : peers_)
      if (const CUmemAccessDesc d = a.desc(peer); d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) access.push_back(d);
    r = api_->set_access(static_cast<CUdeviceptr>(va), size, access.data(), access.size());
    if (r != CUDA_SUCCESS) {
      api_->unmap(static_cast<CUdeviceptr>(va), size);
      return r;
    }
    mapped_[va] = size;
    return r;
  });
}

CUresult DriverBackend::unmap(uintptr_t va, size_t size) {
  if (!api_->unmap) return CUDA_ERROR_NOT_SUPPORTED;
  return in_context([&] {
    std::lock_guard<std::mutex> lock(access_mu_);
    const CUresult r = api_->unmap(static_cast<CUdeviceptr>(va), size);
    // One unmap may cover several mappings (a run of adjacent chunks).
    if (r == CUDA_SUCCESS) mapped_.erase(mapped_.lower_bound(va), mapped_.lower_bound(va + size));
    return r;
  });
}

CUmemAccessDesc DriverBackend::PeerAccess::desc(int peer) const {
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = peer;
  d.flags = std::max(by_pool, by_peer);  // NONE < READ < READWRITE
  return d;
}

CUresult DriverBackend::grant_access(int peer, CUmemAccess_flags flags, bool by_peer_access) {
  if (peer == device_ || !api_->set_access) return CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(access_mu_);
    PeerAccess& a = peers_[peer];
    (by_peer_access ? a.by_peer : a.by_pool) = flags;
    // Nothing mapped: map() gives the access from now on. No context is made current, or
    // retained, for a program that has not let the pool touch the device yet.
    if (mapped_.empty()) return CUDA_SUCCESS;
  }
  return in_context([&] {
    std::lock_guard<std::mutex> lock(access_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return CUDA_SUCCESS;  // a reset meanwhile
    const CUmemAccessDesc desc = it->second.desc(peer);
    CUresult result = CUDA_SUCCESS;
    for (const auto& [va, size] : mapped_)
      if (const CUresult r = api_->set_access(static_cast<CUdeviceptr>(va), size, &desc, 1); r != CUDA_SUCCESS) result = r;
    return result;
  });
}

}  // namespace gpushim
