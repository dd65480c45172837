// Shim: what the driver API tells the core besides allocations and frees (core/shim_inl.h): the
// virtual-memory API, pointer and IPC queries on pooled memory, module attribution, the driver's
// own view of device usage, the memory-pool API on default pools, and device resets.
#include <algorithm>

#include "cuda/driver_backend.h"
#include "cuda/destroyed_contexts.h"
#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "cuda/stream_registry.h"
#include "recorder/run_recorder.h"
#include "stacks/native_stack.h"
#include "util/log.h"
#include "util/units.h"
#include "util/thread_block.h"

namespace gpushim {

// ---- the calling thread's context ----

void Shim::bind_unchecked_thread_context(int dev) {
  thread_slot<bool, ThreadSlot::kContextChecked>() = true;
  const RealDriver& drv = real_driver();
  CUcontext current = nullptr;
  if (drv.cuCtxGetCurrent == nullptr || drv.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != nullptr) return;
  // No context at all: exactly when the real cudaMalloc would have bound the primary one.
  const RealRuntime& rt = real_runtime();
  if (dev < 0 && (rt.cudaGetDevice == nullptr || rt.cudaGetDevice(&dev) != cudaSuccess)) return;
  if (rt.cudaSetDevice) rt.cudaSetDevice(dev);
}

// ---- attribution ----

ModuleId Shim::caller_module_lookup(uintptr_t ra) {
  // The outermost hook's return address is the caller in the common case (an application or a
  // library calling cudaMalloc or cuMemAlloc): no unwinding at all. `- 1` keeps it inside the
  // call instruction even when the call is the last instruction of its module.
  static_assert(kUnknownModule == 0, "a thread's slot starts as zero bytes: no caller, unknown module");
  LastCaller& last = thread_slot<LastCaller, ThreadSlot::kLastCaller>();
  const uintptr_t generation = modules_.generation();
  const ModuleId m = ra != 0 ? modules_.lookup(ra - 1) : kUnknownModule;
  if (m != kUnknownModule && !modules_.is_cuda_plumbing(m)) {
    last = LastCaller{ra, generation, m};  // the generation before the lookup: conservative
    return m;
  }
  // Called from inside libcudart or libcuda (the runtime serving cudaMallocFromPoolAsync, say):
  // the first frame outside them. Unwound here even with stack capture off.
  uint64_t frames[64];
  const size_t n = capture_native_stack(frames, 64, 0);
  for (size_t i = 0; i < n; ++i) {
    if (frames[i] == 0) continue;
    const ModuleId f = modules_.lookup(static_cast<uintptr_t>(frames[i]) - 1);
    if (f != kUnknownModule && !modules_.is_cuda_plumbing(f)) return f;
  }
  return m;
}

// ---- virtual-memory API ----

void Shim::vmm_created(uint64_t handle, uint64_t size, MemoryKind kind, int dev) {
  vmm_.created(VmmTracker::Physical{handle, size, dev, kind});
}

void Shim::vmm_imported(uint64_t handle, int dev) { vmm_.imported(handle, dev); }

void Shim::vmm_retained(uint64_t handle) { vmm_.retained(handle); }

void Shim::drop_vmm(const VmmTracker::Physical& p) {
  AllocationRecord rec;
  if (!books_.release(VmmTracker::key_of(p.handle), &rec)) return;
  const uint64_t t = now_ns();
  if (tracing_) recorder_->trace_free(t, VmmTracker::key_of(p.handle), rec, nullptr, false);
  recorder_->after_event(t);
}

void Shim::array_created(uintptr_t key) {
  CUcontext ctx = nullptr;
  const RealDriver& drv = real_driver();
  if (drv.cuCtxGetCurrent != nullptr && drv.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr)
    arrays_.created(key, ctx);
}

void Shim::vmm_released(uint64_t handle) {
  VmmTracker::Physical gone;
  if (vmm_.released(handle, &gone)) drop_vmm(gone);
}

void Shim::vmm_mapped(uintptr_t va, uint64_t size, uint64_t handle) {
  VmmTracker::Physical sized;
  if (!vmm_.mapped(va, size, handle, &sized)) return;
  // Imported memory becomes visible with its first mapping (its size is unknown before).
  const AllocationRecord rec{sized.size, sized.size, now_ns(), capture_stack(), static_cast<int16_t>(sized.device),
                             sized.kind, Route::kForwarded, caller_module()};
  if (books_.commit(VmmTracker::key_of(handle), rec) && tracing_)
    recorder_->trace_alloc(VmmTracker::key_of(handle), rec, rec.size, nullptr, false);
}

void Shim::vmm_unmapped(uintptr_t va, uint64_t size) {
  std::vector<VmmTracker::Physical> gone;
  vmm_.unmapped(va, size, &gone);
  for (const auto& p : gone) drop_vmm(p);
}

void Shim::va_reserved(uintptr_t va, uint64_t size) { vmm_.address_reserved(va, size); }

void Shim::va_freed(uintptr_t va) {
  std::vector<VmmTracker::Physical> gone;
  vmm_.address_freed(va, &gone);
  for (const auto& p : gone) drop_vmm(p);
}

// ---- queries ----

void Shim::cap_driver_mem_info(size_t* free, size_t* total) {
  int dev = 0;
  if (!current_context_device(&dev)) return;
  DeviceState* d = device(dev);
  if (d == nullptr || d->ledger.budget().limit() == 0) return;
  size_t real_free = 0, real_total = 0;
  const RealDriver& drv = real_driver();
  if (drv.cuMemGetInfo_v2 == nullptr || drv.cuMemGetInfo_v2(&real_free, &real_total) != CUDA_SUCCESS) return;
  apply_cap(d->ledger.budget().limit(), d->ledger.held_from_driver(), real_free, real_total, free, total);
}

Shim::PooledAddress Shim::pooled_address(uintptr_t ptr, BlockView* out) {
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (d == nullptr || d->pool == nullptr || !d->pool->contains(reinterpret_cast<const void*>(ptr))) continue;
    // CUDA describes the whole segment; the program owns only the block it was given.
    AllocationRecord rec;
    uintptr_t base = ptr;
    uint64_t size = 0;
    auto find_record = [&](uintptr_t p) { return d->ledger.find_pooled(p, &rec); };
    if (find_record(ptr)) {
      size = rec.size;
    } else if (!d->pool->find_block(reinterpret_cast<const void*>(ptr), &base, &size) || !find_record(base)) {
      return PooledAddress::kNotAllocated;  // freed, cached, or never handed out
    }
    out->base = base;
    out->size = size;
    // CUDA's buffer id names the segment, shared by every block and kept across reuse; libraries
    // that cache registrations by it (UCX, for one) need one per allocation: the address and the
    // tracker's serial, which differs between any two allocations made at one address.
    out->buffer_id = (1ull << 63) | ((base ^ ((uint64_t{rec.serial} + 1) * 0x9E3779B97F4A7C15ull)) >> 1);
    out->ipc_exportable = d->pool->ipc_export_refusal(reinterpret_cast<const void*>(base), size) == nullptr;
    return PooledAddress::kLiveBlock;
  }
  return PooledAddress::kNotPooled;
}

namespace {

// A GPUSHIM_OWN_SEGMENT_MIN value (as the variable accepts it) that `bytes` reaches.
std::string setting_at_most(uint64_t bytes) {
  if (bytes >= (1ull << 20)) return std::to_string(bytes >> 20) + "MiB";
  if (bytes >= (1ull << 10)) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes);
}

}  // namespace

bool Shim::ipc_export_allowed(uintptr_t ptr, const char* api) {
  const void* p = reinterpret_cast<const void*>(ptr);
  BlockView v;
  switch (pooled_address(ptr, &v)) {
    case PooledAddress::kNotPooled:
      return true;  // memory CUDA handed out directly: its handle is exact
    case PooledAddress::kNotAllocated:
      log_line("%s(%p) refused: the address is inside memory the %s policy holds but not in a live allocation "
               "(freed, or never handed out); returned an invalid-value error",
               api, p, policy_name(config_.policy));
      return false;
    case PooledAddress::kLiveBlock:
      break;
  }
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (d == nullptr || d->pool == nullptr || !d->pool->contains(p)) continue;
    const char* why = d->pool->ipc_export_refusal(reinterpret_cast<const void*>(v.base), v.size);
    if (why == nullptr) return true;
    log_line("%s(%p) refused: under GPUSHIM_POLICY=%s this %s block is %s; for memory to share with legacy IPC "
             "set GPUSHIM_OWN_SEGMENT_MIN=%s (allocations that large get a driver segment of their own, which "
             "IPC exports exactly) or GPUSHIM_POLICY=passthrough; returned an invalid-value error",
             api, p, policy_name(config_.policy), format_bytes(v.size).c_str(), why, setting_at_most(v.size).c_str());
    return false;
  }
  return true;
}

bool Shim::retain_allowed(uintptr_t ptr) {
  BlockView v;
  if (pooled_address(ptr, &v) == PooledAddress::kNotPooled) return true;
  // NCCL's user-buffer registration takes this path for memory that is not legacy-IPC capable,
  // and maps the handle whole at offset 0 in the peer: the physical allocation (a pool chunk or
  // segment) starts with whatever block comes first, not with the caller's. CUDA answers the same
  // for memory that cuMemCreate did not make, which the program asked for as far as it knows.
  log_line("cuMemRetainAllocationHandle(%p) refused: under GPUSHIM_POLICY=%s the address is inside memory the "
           "pool shares among allocations, so the handle would not be the caller's alone; set "
           "GPUSHIM_POLICY=passthrough to share it; returned an invalid-value error",
           reinterpret_cast<const void*>(ptr), policy_name(config_.policy));
  return false;
}

// ---- the driver's view of device usage ----

void Shim::sample_if_due() {
  if (forked_child_) return;
  // The clock is read by the time series, not here.
  const uint64_t pending = usage_pending_.load(std::memory_order_relaxed);
  if (pending == 0 && !usage_.requested()) return;
  const bool due = usage_.claim();  // false: none asked for, or another thread took this round
  if (pending == 0 && !due) return;
  int current = -1;
  if (!current_context_device(&current)) current = -1;
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    const uint64_t bit = 1ull << dev;
    if (!due && (pending & bit) == 0) continue;
    // One prompt attempt per new device (on the thread that just used it, almost always with its
    // context current); after that it waits for the periodic samples, so a device nobody's thread
    // is bound to does not cost every later call two driver queries.
    if ((pending & bit) && (usage_pending_.fetch_and(~bit, std::memory_order_relaxed) & bit) == 0 && !due) continue;
    sample_driver_usage(dev, dev == current);
  }
}

void Shim::sample_usage_now() {
  int dev = -1;
  if (forked_child_ || !current_context_device(&dev) || dev < 0 || dev >= kMaxDevices) return;
  sample_driver_usage(dev, true);
}

bool Shim::sample_driver_usage(int dev, bool current_context) {
  const RelaxedCaptureMode relaxed;  // a capture elsewhere must not see our queries (shim.h)
  DeviceState* d = devices_[dev].load(std::memory_order_acquire);
  if (d == nullptr) return false;
  // Through the calling thread's context when it is on this device; otherwise through the pool's
  // primary context, but only once the pool has used it: asking the driver must never create a
  // context the program did not (a driver-API program may use its own).
  const RealDriver& drv = real_driver();
  PoolFigures f;
  if (!current_context && (d->pool == nullptr || d->driver == nullptr || (d->pool->figures(&f), f.segment_allocs == 0)))
    return false;
  // CUDA's own pool gives memory back in stream order, after the cudaFreeAsync that we read it at:
  // read again, so that held and the driver's figure are of one moment.
  if (d->ledger.uses_cuda_pools()) refresh_cuda_pools(d);
  auto mem_info = [&](size_t* free, size_t* total) {
    if (current_context) return drv.cuMemGetInfo_v2 ? drv.cuMemGetInfo_v2(free, total) : CUDA_ERROR_NOT_INITIALIZED;
    return d->driver->mem_info(free, total);
  };
  // The pair must describe one instant: retry when an allocation moved our figure meanwhile.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const uint64_t held = d->ledger.held_from_driver();
    size_t free = 0, total = 0;
    if (mem_info(&free, &total) != CUDA_SUCCESS) return false;
    if (d->ledger.held_from_driver() != held) continue;
    usage_.record(dev, UsageSample{true, now_ns(), total >= free ? total - free : 0, held});
    return true;
  }
  return false;
}

// ---- the memory-pool API ----
// Shim: the memory-pool API on a device's default pool (what PyTorch's backend:cudaMallocAsync
// asks for its figures, resets, and empty_cache). Under a pooling policy, cudaMallocAsync is
// served by our pool, so the driver's default pool holds nothing: its figures would be zeros. The
// default pool's handle (the driver's own, so every handle a program holds stays valid) stands
// for our pool instead; any other pool stays CUDA's.
CUmemoryPool Shim::default_mempool(int ordinal) {
  if (CUmemoryPool h = default_mempools_[ordinal].load(std::memory_order_acquire)) return h;
  const RealDriver& drv = real_driver();
  CUdevice dev = 0;
  CUmemoryPool h = nullptr;
  if (drv.cuDeviceGet == nullptr || drv.cuDeviceGetDefaultMemPool == nullptr ||
      drv.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || drv.cuDeviceGetDefaultMemPool(&h, dev) != CUDA_SUCCESS)
    return nullptr;
  default_mempools_[ordinal].store(h, std::memory_order_release);  // until a reset (after_device_reset)
  return h;
}

DeviceState* Shim::served_default_mempool(CUmemoryPool pool) {
  // A fork child cannot use its parent's pools (see device_alloc); passthrough has none.
  if (pool == nullptr || forked_child_ || config_.policy == PolicyKind::kPassthrough) return nullptr;
  const RealDriver& drv = real_driver();
  int count = 0;
  if (drv.cuDeviceGetCount == nullptr || drv.cuDeviceGetCount(&count) != CUDA_SUCCESS) return nullptr;
  for (int i = 0; i < count && i < kMaxDevices; ++i) {
    if (default_mempool(i) != pool) continue;
    // A program may ask before its first allocation (PyTorch sets the release threshold first):
    // the device's state is created now, as that allocation would have.
    DeviceState* d = device(i);
    if (d == nullptr || d->pool == nullptr) return nullptr;
    // A pool's calls name the pool, not a context: CUDA's runtime answers them under a context
    // another thread destroyed too (an H200, 2026-11-29), and so does ours.
    return d;
  }
  return nullptr;
}

namespace {
// The attributes our pool answers for the default pool: its figures and its release threshold.
// The reuse flags stay CUDA's (our pools' reuse is always safe).
bool served_mempool_attribute(CUmemPool_attribute attr) {
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      return true;
    default:
      return false;
  }
}
}  // namespace

std::optional<CUresult> Shim::mempool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  uint64_t v = 0;
  DeviceState* d = served_mempool_attribute(attr) ? served_default_mempool(pool) : nullptr;
  if (d == nullptr) return std::nullopt;
  // CUDA refuses the query during a capture that forbids unsafe calls, and the capture is then
  // invalidated (an H200: tests/gpu/capture_queries_h200.jsonl): answering it ourselves must not let
  // a program through that CUDA would stop. The probe is such a call, with CUDA's effect.
  if (capture_forbids_unsafe_call(d->ordinal)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Reserved is what the report calls reserved (everything held from the driver on the device),
  // used what it calls allocated: the same figures, so the program's logs and the report agree.
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = d->ledger.budget().held(); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = d->ledger.budget().window_peak(); break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = d->ledger.counters().live_bytes(); break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = d->ledger.counters().window_peak_bytes(); break;
    default: v = release_thresholds_[d->ordinal].load(std::memory_order_relaxed); break;
  }
  *static_cast<cuuint64_t*>(value) = v;
  return CUDA_SUCCESS;
}

std::optional<CUresult> Shim::mempool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  DeviceState* d = served_mempool_attribute(attr) ? served_default_mempool(pool) : nullptr;
  if (d == nullptr) return std::nullopt;
  // Setting is checked as getting is (an H200 refused both during a conflicting capture).
  if (capture_forbids_unsafe_call(d->ordinal)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t v = *static_cast<const cuuint64_t*>(value);
  switch (attr) {
    // A high-water mark can only be reset, by setting it to 0: it then restarts from the
    // current value (CUDA's rule, which PyTorch's reset_peak_memory_stats relies on).
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (v != 0) return CUDA_ERROR_INVALID_VALUE;
      d->ledger.reset_reserved_high();
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (v != 0) return CUDA_ERROR_INVALID_VALUE;
      d->ledger.reset_used_high();
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: {
      // CUDA's default pool still serves what the shim forwards to it (the driver API's
      // stream-ordered calls, allocations from the default pool named explicitly): the threshold
      // is the program's for that memory too, or CUDA's pool would give all of it back at every
      // synchronization, the refill cost the program set the threshold to avoid.
      const RealDriver& drv = real_driver();
      if (drv.cuMemPoolSetAttribute != nullptr) {
        const RealCallScope in_cuda;
        if (const CUresult r = drv.cuMemPoolSetAttribute(pool, attr, value); r != CUDA_SUCCESS) return r;
      }
      release_thresholds_[d->ordinal].store(v, std::memory_order_relaxed);
      // CUDA gives back what exceeds the threshold at the next synchronization, which no hook of
      // ours sees: lowering it gives the memory back now instead.
      if (d->ledger.budget().held() > v) d->pool->trim_to(v);
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the current figures are read-only
  }
}

std::optional<CUresult> Shim::mempool_trim_to(CUmemoryPool pool, size_t keep) {
  DeviceState* d = served_default_mempool(pool);
  if (d == nullptr) return std::nullopt;
  if (capture_forbids_unsafe_call(d->ordinal)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // as the query above
  d->pool->trim_to(keep);
  // And CUDA's default pool, for what it holds of the forwarded calls (as the threshold above).
  const RealDriver& drv = real_driver();
  if (drv.cuMemPoolTrimTo != nullptr) {
    const RealCallScope in_cuda;
    if (drv.cuMemPoolTrimTo(pool, keep) == CUDA_SUCCESS) mempool_trimmed(pool);
  }
  return CUDA_SUCCESS;
}

void Shim::mempool_read_by_program(CUmemoryPool pool, CUmemPool_attribute attr, const void* value) {
  if (forked_child_ || pool == nullptr || value == nullptr || attr != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) return;
  const uint64_t reserved = *static_cast<const cuuint64_t*>(value);
  const std::shared_lock<std::shared_mutex> alive(cuda_pool_lifetimes_);
  for (auto& slot : devices_) {
    DeviceState* d = slot.load(std::memory_order_acquire);
    if (d != nullptr && d->ledger.uses_cuda_pools() && d->ledger.note_known_cuda_pool_reserved(pool, reserved)) return;
  }
}

void Shim::mempool_access_set(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  if (forked_child_) return;
  DeviceState* d = served_default_mempool(pool);
  if (d == nullptr || d->driver == nullptr) return;
  for (size_t i = 0; i < count; ++i)
    if (map[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
      if (static_cast<DriverBackend*>(d->driver.get())->grant_access(map[i].location.id, map[i].flags, false) != CUDA_SUCCESS)
        log_line("device %d: access for device %d to the pool's mappings was not granted everywhere (cuMemPoolSetAccess)",
                 d->ordinal, map[i].location.id);
}

void Shim::peer_access_changed(CUcontext peer, bool enabled) {
  if (forked_child_) return;
  int accessor = 0;
  if (!current_context_device(&accessor)) return;
  const int owner = device_of_primary_context(peer);
  if (owner < 0 || owner >= kMaxDevices) return;  // a context the program made: the pools' memory is not in it
  // Made now if the pools have not served that device yet (peer links are set up at start, as
  // PyTorch and NCCL do): its first mappings must carry the access.
  DeviceState* d = device(owner);
  if (d == nullptr || d->driver == nullptr) return;
  const CUmemAccess_flags flags = enabled ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  if (static_cast<DriverBackend*>(d->driver.get())->grant_access(accessor, flags, true) != CUDA_SUCCESS)
    log_line("device %d: access for device %d to the pool's mappings was not granted everywhere (peer access)", owner,
             accessor);
}

void Shim::mempool_current_set(int device, CUmemoryPool pool) {
  if (device < 0 || device >= kMaxDevices) return;
  const CUmemoryPool def = default_mempool(device);
  foreign_current_mempool_[device].store(def != nullptr && pool != def, std::memory_order_relaxed);
}

// CUDA's own pools (where no pool of ours serves a stream-ordered call): each pool's reservation
// beyond the allocations the books hold from it is held from the driver too, kept per pool by the
// device's ledger (DeviceLedger::note_cuda_pool_alloc). A pool is
// named to the driver only while it surely exists: one the caller allocated from a moment ago, the
// device's current pool (a destroyed current pool reverts to the default), or one noted before
// (mempool_destroy forgets a pool under cuda_pool_lifetimes_, which every reading holds shared).
void Shim::read_cuda_pool(DeviceState* d, CUmemoryPool pool) {
  const RealDriver& drv = real_driver();
  cuuint64_t reserved = 0;
  if (pool == nullptr || !drv.cuMemPoolGetAttribute ||
      drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS)
    return;
  d->ledger.note_cuda_pool_reserved(pool, reserved);
}

CUmemoryPool Shim::current_mempool(int ordinal) {
  const RealDriver& drv = real_driver();
  CUdevice dev = 0;
  CUmemoryPool pool = nullptr;
  if (drv.cuDeviceGet == nullptr || drv.cuDeviceGetMemPool == nullptr ||
      drv.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || drv.cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS)
    return nullptr;
  return pool;
}

void Shim::cuda_pool_allocated(DeviceState* d, CUmemoryPool pool, uintptr_t ptr, uint64_t size) {
  if (d == nullptr) return;
  const RelaxedCaptureMode relaxed;  // as in sample_driver_usage
  const std::shared_lock<std::shared_mutex> alive(cuda_pool_lifetimes_);
  if (pool == nullptr) pool = current_mempool(d->ordinal);
  if (pool == nullptr) return;
  d->ledger.note_cuda_pool_alloc(pool, ptr, size);
  read_cuda_pool(d, pool);
}

void Shim::cuda_pool_refused(DeviceState* d, CUmemoryPool pool) {
  if (d == nullptr) return;
  const RelaxedCaptureMode relaxed;
  const std::shared_lock<std::shared_mutex> alive(cuda_pool_lifetimes_);
  if (pool == nullptr) pool = current_mempool(d->ordinal);
  if (pool != nullptr) read_cuda_pool(d, pool);
}

void Shim::refresh_cuda_pools(DeviceState* d) {
  const RelaxedCaptureMode relaxed;
  const std::shared_lock<std::shared_mutex> alive(cuda_pool_lifetimes_);
  for (CUmemoryPool pool : d->ledger.cuda_pools()) read_cuda_pool(d, pool);
}

// Not from on_unload: by the library destructors libcuda may be finalized. Before them the driver
// still answers (after the runtime's own teardown too: the pools of a context it released were
// forgotten by runtime_release); a pool named here is one the books know alive, and a refusal
// (CUDA_ERROR_DEINITIALIZED) leaves its last reading.
void Shim::refresh_cuda_pools_for_report() {
  if (forked_child_ || recorder_->reported()) return;
  for (auto& slot : devices_) {
    DeviceState* d = slot.load(std::memory_order_acquire);
    if (d != nullptr && d->ledger.uses_cuda_pools()) refresh_cuda_pools(d);
  }
}

void Shim::mempool_trimmed(CUmemoryPool pool) {
  if (forked_child_ || pool == nullptr) return;
  const RelaxedCaptureMode relaxed;
  const std::shared_lock<std::shared_mutex> alive(cuda_pool_lifetimes_);
  for (auto& slot : devices_) {
    DeviceState* d = slot.load(std::memory_order_acquire);
    if (d != nullptr && d->ledger.uses_cuda_pools() && d->ledger.knows_cuda_pool(pool)) read_cuda_pool(d, pool);
  }
}

CUresult Shim::mempool_destroy(CUmemoryPool pool, absl::FunctionRef<CUresult()> destroy) {
  if (forked_child_) return destroy();
  // Alone: no reading names the pool while it is destroyed, and none finds it afterwards.
  const std::unique_lock<std::shared_mutex> alone(cuda_pool_lifetimes_);
  const CUresult r = destroy();
  if (r != CUDA_SUCCESS) return r;
  for (auto& slot : devices_)
    if (DeviceState* d = slot.load(std::memory_order_acquire)) d->ledger.forget_cuda_pool(pool);
  // A device whose current pool this was has its default pool current again (cuMemPoolDestroy):
  // the pool of ours serves its stream-ordered calls again. Asked, not assumed: only CUDA knows
  // whether the destroyed pool was the current one.
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    if (!foreign_current_mempool_[dev].load(std::memory_order_relaxed)) continue;
    if (CUmemoryPool current = current_mempool(dev)) mempool_current_set(dev, current);
  }
  return r;
}

// ---- device resets and destroyed contexts ----
// Device resets: cudaDeviceReset and cuDevicePrimaryCtxReset free every allocation of the device's
// primary context, and so does destroying that context (its last cuDevicePrimaryCtxRelease). A
// pool that kept those segments would hand out addresses the driver already freed, the worst
// defect an allocator can have. So before a reset the core frees every live allocation of the
// context itself (the pool's, through the pool; the forwarded ones the driver says are the
// context's only in the books, the reset frees them) and gives every pool segment back to the driver while that memory still exists:
// nothing is freed twice, and the next allocation gets fresh memory. Each allocation the reset
// freed is recorded per site (RunRecorder::freed_by_reset): the report's freed_by_reset section
// shows who still held memory.
void Shim::forget_streams_in_pools(absl::FunctionRef<bool(CUstream)> doomed) {
  for (auto& slot : devices_)
    if (DeviceState* d = slot.load(std::memory_order_acquire); d != nullptr && d->pool != nullptr)
      d->pool->forget_streams(doomed);
}

void Shim::before_stream_destroy(CUstream stream) {
  if (!forked_child_ && names_created_stream(stream))
    forget_streams_in_pools([stream](CUstream s) { return s == stream; });
  note_stream_destroying(stream);
}

void Shim::before_context_destroy(CUcontext ctx) {
  if (forked_child_ || ctx == nullptr) return;
  // A stream the registry cannot place is retagged too: recording its event now is safe, while
  // every stream still exists, and a block kept naming it might outlive it.
  forget_streams_in_pools([ctx](CUstream s) {
    const CUcontext owner = context_of_stream(s);
    return owner == nullptr || owner == ctx;
  });
  forget_context(ctx, /*context_alive=*/true);
}

void Shim::before_device_reset(int ordinal, const std::vector<OwnedAllocation>* owned) {
  if (forked_child_) return;
  // The reset destroys the primary context's streams (and events) without a cuStreamDestroy:
  // blocks and fences stop naming them while they still exist.
  const CUcontext primary = owned == nullptr ? primary_context_if_active(ordinal) : nullptr;
  if (primary != nullptr) before_context_destroy(primary);
  // What the reset frees of the memory CUDA handed out: the primary context's only. A context
  // the program created keeps its memory, and cuMemCreate's belongs to no context.
  std::vector<OwnedAllocation> asked;
  if (owned == nullptr) {
    if (primary != nullptr) asked = owned_by_context(primary, /*pool_memory=*/true);
    owned = &asked;
  }
  DeviceState* d = existing_device(ordinal);
  // Nothing of this device was ever seen (pinned host memory may have been, with no device).
  if (d == nullptr && owned->empty()) return;
  if (d != nullptr) recorder_->device_reset(ordinal);
  uint64_t freed = 0, count = 0;
  auto freed_one = [&](uintptr_t p, const AllocationRecord& rec) {
    recorder_->freed_by_reset(p, rec);
    freed += rec.size;
    ++count;
  };
  // Blocks whose records the pool keeps: freed through it, with their figures.
  if (d != nullptr && d->pool && d->ledger.pool_keeps_records()) {
    std::vector<uintptr_t> live;
    d->pool->live_payload_blocks(&live);
    for (uintptr_t p : live) {
      AllocationRecord rec;
      if (d->ledger.release_pooled(reinterpret_cast<void*>(p), nullptr, false, /*host_api=*/false, &rec) ==
          CUDA_SUCCESS)
        freed_one(p, rec);
    }
  }
  // Pooled blocks of pools that keep no records.
  for (const auto& [p, rec] : books_.records().live()) {
    if (d == nullptr || rec.device != ordinal || rec.route != Route::kPooled) continue;
    AllocationRecord gone;
    if (!books_.forget(p, &gone)) continue;
    if (d->pool->deallocate(reinterpret_cast<void*>(p), nullptr, false) != CUDA_SUCCESS) {
      books_.restore(p, gone);
      continue;
    }
    books_.count_free(gone);
    freed_one(p, gone);
  }
  // Forwarded memory of every kind the context owns (device, graph, pinned host, managed,
  // imported, its stream-ordered memory), which the real reset frees.
  for (const OwnedAllocation& o : *owned) {
    AllocationRecord gone;
    if (forget_owned(o, &gone)) freed_one(o.ptr, gone);
  }
  // Every segment back to the driver now, while it is still the process's memory; the reset then
  // frees nothing of ours, and the pool starts empty.
  // An empty pool is left alone: releasing would synchronize, and so retain a context that may
  // be gone (after_context_destroyed) or never have existed.
  PoolFigures f;
  if (d != nullptr && d->pool) d->pool->figures(&f);
  if (f.reserved_bytes != 0) {
    d->pool->release_before_reset();
    d->pool->figures(&f);
    if (f.reserved_bytes != 0)
      log_line("device %d reset while its pool could not give back %s (a stream capture in progress?); "
               "those addresses may be reused after the reset",
               ordinal, format_bytes(f.reserved_bytes).c_str());
  }
  // At teardown (after the exit report) a library releasing its context is no news.
  if (count != 0 && !recorder_->reported())
    log_line("device %d reset: %s in %llu live allocation%s freed by the reset (see freed_by_reset in the report)",
             ordinal, format_bytes(freed).c_str(), static_cast<unsigned long long>(count), count == 1 ? "" : "s");
}

void Shim::forget_cuda_pools_of(int ordinal) {
  if (ordinal >= 0 && ordinal < kMaxDevices) {
    // A context's end destroys the device's memory pools: the default pool is made anew (its
    // handle may differ), it is current again, and its release threshold is the default.
    default_mempools_[ordinal].store(nullptr, std::memory_order_release);
    foreign_current_mempool_[ordinal].store(false, std::memory_order_relaxed);
    release_thresholds_[ordinal].store(UINT64_MAX, std::memory_order_relaxed);
  }
  DeviceState* d = existing_device(ordinal);
  if (d != nullptr) d->ledger.forget_cuda_pools();  // destroyed with the context, their memory freed
}

void Shim::after_device_reset(int ordinal) {
  if (forked_child_) return;
  forget_cuda_pools_of(ordinal);
  DeviceState* d = existing_device(ordinal);
  if (d == nullptr || d->driver == nullptr) return;
  // make_device builds the pool's driver backend as a DriverBackend, and only that.
  static_cast<DriverBackend*>(d->driver.get())->forget_context();
}

bool Shim::release_cached_for_forwarded(DeviceState* d) {
  if (forked_child_ || d == nullptr || d->pool == nullptr) return false;
  PoolFigures f;
  d->pool->figures(&f);
  if (f.cached_free_bytes == 0) return false;
  d->pool->release_cached();
  return true;
}

void Shim::free_served_after_all(uintptr_t p) {
  const RealCallScope in_cuda;
  const RealRuntime& rt = real_runtime();
  void* const ptr = reinterpret_cast<void*>(p);
  const cudaError_t e = rt.cudaFree ? rt.cudaFree(ptr) : cudaErrorNotSupported;
  if (e != cudaSuccess)
    log_line("could not free %p, which CUDA served beyond the cap or GPUSHIM_FAIL, again (%s): it stays allocated",
             ptr, RuntimeCodes::name(e));
}

Shim::ContextRoute Shim::route_for_current_context(DeviceState* d, bool stream_ordered) {
  if (d == nullptr || !program_contexts_made()) return ContextRoute::kPool;
  if (d->driver == nullptr) {
    // No pool (passthrough) and so no backend to ask: only whether CUDA refuses the call. A reset
    // primary context may refuse the question too, where the runtime would make it anew: then
    // the request is CUDA's to answer all the same, and the cap is asked after it (with an undo).
    const RealDriver& drv = real_driver();
    CUcontext current = nullptr;
    CUdevice dev = 0;
    if (drv.cuCtxGetCurrent == nullptr || drv.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr)
      return ContextRoute::kPool;
    const bool refuses = context_known_destroyed(current) ||
                         (drv.cuCtxGetDevice != nullptr && drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS);
    return refuses ? ContextRoute::kRefusedByCuda : ContextRoute::kPool;
  }
  // make_device builds the pool's driver backend as a DriverBackend, and only that.
  switch (static_cast<DriverBackend*>(d->driver.get())->current_context()) {
    case DriverBackend::CurrentContext::kPools:
      return ContextRoute::kPool;
    // Stream-ordered memory is its memory pool's, not a context's (cuCtxDestroy leaves it), and
    // the pools order it on that context's streams (docs/policies.md); cudaMalloc's memory is the
    // current context's, lives and dies with it, and says so to pointer queries.
    case DriverBackend::CurrentContext::kProgramsOwn:
      return stream_ordered ? ContextRoute::kPool : ContextRoute::kCuda;
    case DriverBackend::CurrentContext::kDestroyed:
      return ContextRoute::kRefusedByCuda;
  }
  return ContextRoute::kPool;
}

CUresult Shim::pooled_free_refused(void* ptr, CUstream stream, bool stream_ordered, bool driver_api) {
  const RealDriver& drv = real_driver();
  if (driver_api) {
    // The driver frees in the context a created stream belongs to, and otherwise in the caller's
    // (cuMemFree; stream 0, the legacy and per-thread streams are the current context's), which
    // it does not make as the runtime does.
    if (stream_ordered && names_created_stream(stream)) return CUDA_SUCCESS;
    CUcontext current = nullptr;
    if (drv.cuCtxGetCurrent != nullptr && drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == nullptr)
      return is_pooled_block(ptr) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
    if (!program_contexts_made()) return CUDA_SUCCESS;
  }
  const int dev = pooled_device_of(ptr, pooled_devices_.load(std::memory_order_acquire));
  DeviceState* d = dev >= 0 ? existing_device(dev) : nullptr;
  // A live context of the program's frees any pointer (unified addressing), as the primary does.
  if (d == nullptr || pool_serves_current_context(d, /*stream_ordered=*/true)) return CUDA_SUCCESS;
  // A primary context reset (cudaDeviceReset) stays current but unusable, and the runtime's own
  // free first makes it anew, as every runtime call does; a context the program made and another
  // thread destroyed it cannot. So the runtime is asked to do that step (cudaFree(0)), and the
  // question asked again: without it, freeing device 0's block with a reset device 1 current was
  // refused (709) where CUDA frees it.
  if (!driver_api) {
    const RealRuntime& rt = real_runtime();
    if (rt.cudaFree != nullptr && rt.cudaFree(nullptr) == cudaSuccess &&
        pool_serves_current_context(d, /*stream_ordered=*/true))
      return CUDA_SUCCESS;
  }
  // The driver's own code where it refuses the context (a reset primary one); under a context
  // another thread destroyed, which it still answers, CUDA's codes as an H200 gave them
  // (2026-11-29, docs/gpu-validation.md run 8): cuMemFree CUDA_ERROR_CONTEXT_IS_DESTROYED, the
  // runtime's frees cudaErrorDeviceUninitialized ("invalid device context", CUDA_ERROR_INVALID_CONTEXT's).
  CUdevice any = 0;
  const CUresult asked = drv.cuCtxGetDevice != nullptr ? drv.cuCtxGetDevice(&any) : CUDA_SUCCESS;
  if (asked != CUDA_SUCCESS) return asked;
  return driver_api ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult Shim::runtime_release(int ordinal, absl::FunctionRef<CUresult()> release) {
  if (forked_child_) return release();
  // Alone, as mempool_destroy: no reading names a pool while the release may destroy it.
  const std::unique_lock<std::shared_mutex> alone(cuda_pool_lifetimes_);
  const CUresult r = release();
  unsigned flags = 0;
  int active = 1;
  const RealDriver& drv = real_driver();
  if (r == CUDA_SUCCESS && drv.cuDevicePrimaryCtxGetState != nullptr &&
      drv.cuDevicePrimaryCtxGetState(ordinal, &flags, &active) == CUDA_SUCCESS && active == 0)
    forget_cuda_pools_of(ordinal);
  return r;
}

bool Shim::called_by_cuda() {
  const uintptr_t ra = current_hook_caller();
  if (ra == 0) return false;
  const ModuleId m = modules_.lookup(ra - 1);
  return m != kUnknownModule && modules_.is_cuda_plumbing(m);
}

void Shim::after_context_destroyed(int ordinal, CUcontext primary, const std::vector<OwnedAllocation>& owned) {
  // Its streams and events are gone already: dropped from the registry with no driver call.
  forget_context(primary, /*context_alive=*/false);
  // The same bookkeeping as a reset; the memory is gone already, but the pool cannot have held
  // any: its backend keeps a reference to the context from its first segment on, so the program's
  // last release cannot destroy a context the pool uses.
  before_device_reset(ordinal, &owned);
  after_device_reset(ordinal);
}



// cuCtxDestroy frees what was allocated in the context (cuMemAlloc, cuMemAllocPitch, pinned host
// and managed memory), but not stream-ordered memory (it belongs to a memory pool) nor
// cuMemCreate's (no context at all). The pools never hold memory of such a context: their backend
// allocates only in the device's primary context (DriverBackend::in_context). So only forwarded
// allocations can be the context's, and the driver knows which: asked here, at a rare call,
// rather than recording a context with every allocation.
std::vector<Shim::OwnedAllocation> Shim::owned_by_context(CUcontext ctx, bool pool_memory) {
  std::vector<OwnedAllocation> owned;
  const RealDriver& drv = real_driver();
  if (forked_child_ || ctx == nullptr || drv.cuPointerGetAttribute == nullptr) return owned;
  // Arrays: the context each was made in is known (the driver has no pointer query for a handle).
  for (uintptr_t key : arrays_.of_context(ctx)) {
    AllocationRecord rec;
    if (books_.records().find(key, &rec)) owned.push_back(OwnedAllocation{key, rec.serial});
  }
  for (const auto& [p, rec] : books_.records().live()) {
    // Pooled, a cuMemCreate handle, or an array (above).
    if (rec.route != Route::kForwarded || p == VmmTracker::key_of(p) || ArrayBooks::is_key(p)) continue;
    CUcontext owner = nullptr;
    CUmemoryPool pool = nullptr;
    if (drv.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, static_cast<CUdeviceptr>(p)) != CUDA_SUCCESS ||
        owner != ctx)
      continue;
    if (!pool_memory &&
        drv.cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, static_cast<CUdeviceptr>(p)) ==
            CUDA_SUCCESS &&
        pool != nullptr)
      continue;
    owned.push_back(OwnedAllocation{p, rec.serial});
  }
  return owned;
}

bool Shim::forget_owned(const OwnedAllocation& o, AllocationRecord* gone) {
  if (!books_.forget(o.ptr, gone)) return false;  // freed meanwhile by another thread
  if (gone->serial != o.serial) {  // ... and the address handed out again, in another context
    books_.restore(o.ptr, *gone);
    return false;
  }
  books_.count_free(*gone);
  if (ArrayBooks::is_key(o.ptr)) arrays_.destroyed(o.ptr);
  return true;
}

void Shim::after_context_destroy(const std::vector<OwnedAllocation>& owned) {
  uint64_t bytes[kMaxDevices] = {}, counts[kMaxDevices] = {};
  for (const OwnedAllocation& o : owned) {
    AllocationRecord gone;
    if (!forget_owned(o, &gone)) continue;
    recorder_->freed_by_reset(o.ptr, gone);
    if (gone.device >= 0 && gone.device < kMaxDevices) bytes[gone.device] += gone.size, ++counts[gone.device];
  }
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    if (counts[dev] == 0) continue;
    if (devices_[dev].load(std::memory_order_acquire) != nullptr) recorder_->context_destroyed(dev);
    if (!recorder_->reported())
      log_line("device %d: cuCtxDestroy freed %s in %llu live allocation%s of the destroyed context (see "
               "freed_by_reset in the report)",
               dev, format_bytes(bytes[dev]).c_str(), static_cast<unsigned long long>(counts[dev]),
               counts[dev] == 1 ? "" : "s");
  }
}

}  // namespace gpushim
