// Shim: the driver API's allocations, the virtual-memory API, pointer and IPC queries on pooled
// memory, module attribution and the driver's own view of device usage.
#include <algorithm>

#include "core/call_context.h"
#include "core/shim.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "stacks/native_stack.h"
#include "util/log.h"
#include "util/units.h"

namespace gpushim {

// ---- the calling thread's context ----

void Shim::bind_thread_context(int dev) {
  __attribute__((tls_model("initial-exec"))) thread_local bool checked = false;  // every allocation reads it
  if (checked) return;
  checked = true;
  const RealDriver& drv = real_driver();
  CUcontext current = nullptr;
  if (drv.cuCtxGetCurrent == nullptr || drv.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != nullptr) return;
  // No context at all: exactly when the real cudaMalloc would have bound the primary one.
  if (const RealRuntime& rt = real_runtime(); rt.cudaSetDevice) rt.cudaSetDevice(dev);
}

// ---- attribution ----

ModuleId Shim::caller_module() {
  // The outermost hook's return address is the caller in the common case (an application or a
  // library calling cudaMalloc or cuMemAlloc): no unwinding at all. `- 1` keeps it inside the
  // call instruction even when the call is the last instruction of its module.
  const uintptr_t ra = current_hook_caller();
  // A thread allocates from the same few call sites over and over: remember the last answer, for
  // as long as the module map answers from the same snapshot (snapshots are never freed, so a
  // generation is never reused).
  struct LastCaller {
    uintptr_t ra, generation;
    ModuleId module;
  };
  __attribute__((tls_model("initial-exec"))) thread_local LastCaller last{0, 0, kUnknownModule};
  const uintptr_t generation = modules_.generation();
  if (ra != 0 && ra == last.ra && generation == last.generation) return last.module;
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
  if (trace_) trace_free(t, VmmTracker::key_of(p.handle), rec, nullptr, false);
  maybe_sample(t);
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
  if (books_.commit(VmmTracker::key_of(handle), rec) && trace_)
    trace_alloc(VmmTracker::key_of(handle), rec, rec.size, nullptr, false);
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
  apply_cap(d->ledger.budget().limit(), d->ledger.budget().held(), real_free, real_total, free, total);
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

// ---- the driver's view of device usage ----

void Shim::after_hook() {
  if (forked_child_) return;
  // Two relaxed loads on every call; the clock is read by the time series, not here.
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
  DeviceState* d = devices_[dev].load(std::memory_order_acquire);
  if (d == nullptr) return false;
  // Through the calling thread's context when it is on this device; otherwise through the pool's
  // primary context, but only once the pool has used it: asking the driver must never create a
  // context the program did not (a driver-API program may use its own).
  const RealDriver& drv = real_driver();
  PoolFigures f;
  if (!current_context && (d->pool == nullptr || d->driver == nullptr || (d->pool->figures(&f), f.segment_allocs == 0)))
    return false;
  auto mem_info = [&](size_t* free, size_t* total) {
    if (current_context) return drv.cuMemGetInfo_v2 ? drv.cuMemGetInfo_v2(free, total) : CUDA_ERROR_NOT_INITIALIZED;
    return d->driver->mem_info(free, total);
  };
  // The pair must describe one instant: retry when an allocation moved our figure meanwhile.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const uint64_t held = d->ledger.budget().held();
    size_t free = 0, total = 0;
    if (mem_info(&free, &total) != CUDA_SUCCESS) return false;
    if (d->ledger.budget().held() != held) continue;
    usage_.record(dev, UsageSample{true, now_ns(), total >= free ? total - free : 0, held});
    return true;
  }
  return false;
}

}  // namespace gpushim
