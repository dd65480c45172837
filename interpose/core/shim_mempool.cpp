// Shim: the memory-pool API on a device's default pool (what PyTorch's backend:cudaMallocAsync
// asks for its figures, resets, and empty_cache). Under a pooling policy, cudaMallocAsync is
// served by our pool, so the driver's default pool holds nothing: its figures would be zeros. The
// default pool's handle (the driver's own, so every handle a program holds stays valid) stands
// for our pool instead; any other pool stays CUDA's.
#include "core/shim.h"
#include "cuda/real_driver.h"

namespace gpushim {

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
    return d != nullptr && d->pool != nullptr ? d : nullptr;
  }
  return nullptr;
}

std::optional<CUresult> Shim::mempool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  uint64_t v = 0;
  DeviceState* d = nullptr;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      d = served_default_mempool(pool);
      break;
    default:
      return std::nullopt;  // the reuse flags: CUDA keeps them (our pools' reuse is always safe)
  }
  if (d == nullptr) return std::nullopt;
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
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      break;
    default:
      return std::nullopt;
  }
  DeviceState* d = served_default_mempool(pool);
  if (d == nullptr) return std::nullopt;
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
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      release_thresholds_[d->ordinal].store(v, std::memory_order_relaxed);
      // CUDA gives back what exceeds the threshold at the next synchronization, which no hook of
      // ours sees: lowering it gives the memory back now instead.
      if (d->ledger.budget().held() > v) d->pool->trim_to(v);
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the current figures are read-only
  }
}

std::optional<CUresult> Shim::mempool_trim_to(CUmemoryPool pool, size_t keep) {
  DeviceState* d = served_default_mempool(pool);
  if (d == nullptr) return std::nullopt;
  d->pool->trim_to(keep);
  return CUDA_SUCCESS;
}

void Shim::mempool_current_set(int device, CUmemoryPool pool) {
  if (device < 0 || device >= kMaxDevices) return;
  const CUmemoryPool def = default_mempool(device);
  foreign_current_mempool_[device].store(def != nullptr && pool != def, std::memory_order_relaxed);
}

}  // namespace gpushim
