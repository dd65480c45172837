// Device resets: cudaDeviceReset and cuDevicePrimaryCtxReset free every allocation of the device's
// primary context, and so does destroying that context (its last cuDevicePrimaryCtxRelease). A
// pool that kept those segments would hand out addresses the driver already freed, the worst
// defect an allocator can have. So before a reset the core frees every live allocation of the
// device itself (the pool's, through the pool; the forwarded ones only in the books, the reset
// frees them) and gives every pool segment back to the driver while that memory still exists:
// nothing is freed twice, and the next allocation gets fresh memory. Each allocation the reset
// freed is recorded per site: the report's freed_by_reset section shows who still held memory.
#include "core/shim.h"

#include "cuda/driver_backend.h"
#include "cuda/real_driver.h"
#include "util/log.h"
#include "util/units.h"

namespace gpushim {

void Shim::note_freed_by_reset(const AllocationRecord& rec) {
  std::lock_guard<std::mutex> lock(resets_mu_);
  SiteTotals& t = freed_by_reset_[SiteKey{rec.stack, rec.device, rec.kind}];
  t.bytes += rec.size;
  t.count += 1;
}

void Shim::before_device_reset(int ordinal) {
  if (forked_child_) return;
  DeviceState* d = ordinal >= 0 && ordinal < kMaxDevices ? devices_[ordinal].load(std::memory_order_acquire) : nullptr;
  if (d == nullptr) return;  // nothing of this device was ever seen
  d->resets.fetch_add(1, std::memory_order_relaxed);
  uint64_t freed = 0, count = 0;
  auto freed_one = [&](uintptr_t p, const AllocationRecord& rec) {
    note_freed_by_reset(rec);
    freed += rec.size;
    ++count;
    if (trace_) trace_free(record_time_ns(), p, rec, nullptr, false);
  };
  // Blocks whose records the pool keeps: freed through it, with their figures.
  if (d->pool && d->ledger.pool_keeps_records()) {
    std::vector<uintptr_t> live;
    d->pool->live_payload_blocks(&live);
    for (uintptr_t p : live) {
      AllocationRecord rec;
      if (d->ledger.release_pooled(reinterpret_cast<void*>(p), nullptr, false, /*host_api=*/false, &rec) ==
          CUDA_SUCCESS)
        freed_one(p, rec);
    }
  }
  // Everything else of the device the tracker holds: pooled blocks of pools that keep no records,
  // and forwarded memory of every kind the context owns (device, graph, pinned host, managed,
  // imported), which the real reset frees.
  for (const auto& [p, rec] : books_.records().live()) {
    if (rec.device != ordinal) continue;
    AllocationRecord gone;
    if (!books_.forget(p, &gone)) continue;
    if (gone.route == Route::kPooled && d->pool->deallocate(reinterpret_cast<void*>(p), nullptr, false) != CUDA_SUCCESS) {
      books_.restore(p, gone);
      continue;
    }
    books_.count_free(gone);
    freed_one(p, gone);
  }
  // Every segment back to the driver now, while it is still the process's memory; the reset then
  // frees nothing of ours, and the pool starts empty.
  // An empty pool is left alone: releasing would synchronize, and so retain a context that may
  // be gone (after_context_destroyed) or never have existed.
  PoolFigures f;
  if (d->pool) d->pool->figures(&f);
  if (f.reserved_bytes != 0) {
    d->pool->release_cached();
    d->pool->figures(&f);
    if (f.reserved_bytes != 0)
      log_line("device %d reset while its pool could not give back %s (a stream capture in progress?); "
               "those addresses may be reused after the reset",
               ordinal, format_bytes(f.reserved_bytes).c_str());
  }
  // At teardown (after the exit report) a library releasing its context is no news.
  if (count != 0 && !reported_.load(std::memory_order_relaxed))
    log_line("device %d reset: %s in %llu live allocation%s freed by the reset (see freed_by_reset in the report)",
             ordinal, format_bytes(freed).c_str(), static_cast<unsigned long long>(count), count == 1 ? "" : "s");
}

void Shim::after_device_reset(int ordinal) {
  if (forked_child_) return;
  if (ordinal >= 0 && ordinal < kMaxDevices) {
    // A reset destroys the device's memory pools with its context: the default pool is made anew
    // (its handle may differ), it is current again, and its release threshold is the default.
    default_mempools_[ordinal].store(nullptr, std::memory_order_release);
    foreign_current_mempool_[ordinal].store(false, std::memory_order_relaxed);
    release_thresholds_[ordinal].store(UINT64_MAX, std::memory_order_relaxed);
  }
  DeviceState* d = ordinal >= 0 && ordinal < kMaxDevices ? devices_[ordinal].load(std::memory_order_acquire) : nullptr;
  if (d == nullptr || d->driver == nullptr) return;
  // make_device builds the pool's driver backend as a DriverBackend, and only that.
  static_cast<DriverBackend*>(d->driver.get())->forget_context();
}

bool Shim::called_by_cuda() {
  const uintptr_t ra = current_hook_caller();
  if (ra == 0) return false;
  const ModuleId m = modules_.lookup(ra - 1);
  return m != kUnknownModule && modules_.is_cuda_plumbing(m);
}

void Shim::after_context_destroyed(int ordinal) {
  // The same bookkeeping as a reset; the memory is gone already, but the pool cannot have held
  // any: its backend keeps a reference to the context from its first segment on, so the program's
  // last release cannot destroy a context the pool uses.
  before_device_reset(ordinal);
  after_device_reset(ordinal);
}

}  // namespace gpushim

namespace gpushim {

// cuCtxDestroy frees what was allocated in the context (cuMemAlloc, cuMemAllocPitch, pinned host
// and managed memory), but not stream-ordered memory (it belongs to a memory pool) nor
// cuMemCreate's (no context at all). The pools never hold memory of such a context: their backend
// allocates only in the device's primary context (DriverBackend::in_context). So only forwarded
// allocations can be the context's, and the driver knows which: asked here, at a rare call,
// rather than recording a context with every allocation.
std::vector<Shim::OwnedAllocation> Shim::owned_by_context(CUcontext ctx) {
  std::vector<OwnedAllocation> owned;
  const RealDriver& drv = real_driver();
  if (forked_child_ || ctx == nullptr || drv.cuPointerGetAttribute == nullptr) return owned;
  for (const auto& [p, rec] : books_.records().live()) {
    if (rec.route != Route::kForwarded || p == VmmTracker::key_of(p)) continue;  // pooled, or a cuMemCreate handle
    CUcontext owner = nullptr;
    CUmemoryPool pool = nullptr;
    if (drv.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, static_cast<CUdeviceptr>(p)) != CUDA_SUCCESS ||
        owner != ctx)
      continue;
    if (drv.cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, static_cast<CUdeviceptr>(p)) ==
            CUDA_SUCCESS &&
        pool != nullptr)
      continue;
    owned.push_back(OwnedAllocation{p, rec.serial});
  }
  return owned;
}

void Shim::after_context_destroy(const std::vector<OwnedAllocation>& owned) {
  uint64_t bytes[kMaxDevices] = {}, counts[kMaxDevices] = {};
  for (const OwnedAllocation& o : owned) {
    AllocationRecord gone;
    if (!books_.forget(o.ptr, &gone)) continue;  // freed meanwhile by another thread
    if (gone.serial != o.serial) {  // ... and the address handed out again, in another context
      books_.restore(o.ptr, gone);
      continue;
    }
    books_.count_free(gone);
    note_freed_by_reset(gone);
    if (trace_) trace_free(record_time_ns(), o.ptr, gone, nullptr, false);
    if (gone.device >= 0 && gone.device < kMaxDevices) bytes[gone.device] += gone.size, ++counts[gone.device];
  }
  for (int dev = 0; dev < kMaxDevices; ++dev) {
    if (counts[dev] == 0) continue;
    if (DeviceState* d = devices_[dev].load(std::memory_order_acquire))
      d->context_destroys.fetch_add(1, std::memory_order_relaxed);
    if (!reported_.load(std::memory_order_relaxed))
      log_line("device %d: cuCtxDestroy freed %s in %llu live allocation%s of the destroyed context (see "
               "freed_by_reset in the report)",
               dev, format_bytes(bytes[dev]).c_str(), static_cast<unsigned long long>(counts[dev]),
               counts[dev] == 1 ? "" : "s");
  }
}

}  // namespace gpushim
