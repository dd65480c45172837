#include "accounting/device_ledger.h"

#include <algorithm>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "policy/forwarding_backend.h"
#include "policy/limited_backend.h"
#include "policy/shared_mappings.h"

namespace gpushim {

// The segments (and vmm mappings) the pool takes and gives back, into the ledger's PyTorch
// statistics. On the driver call's path, never an allocation's. A pool that keeps the records
// calls in under its lock, which every other writer of these figures holds too (the lock rule);
// any other pool (GPUSHIM_OWN_SEGMENT_MIN's, whose inner pool has a lock of its own) gets atomics.
class DeviceLedger::SegmentStats final : public ForwardingBackend {
 public:
  SegmentStats(Backend& upstream, DeviceLedger& ledger) : ForwardingBackend(upstream), ledger_(ledger) {}
  CUresult segment_alloc(size_t bytes, void** out) override {
    const CUresult r = upstream().segment_alloc(bytes, out);
    if (r == CUDA_SUCCESS) each([&](auto sync) { ledger_.torch_.segment<sync.value>(bytes, +1); });
    return r;
  }
  CUresult segment_free(void* p, size_t bytes) override {
    const CUresult r = upstream().segment_free(p, bytes);
    if (r == CUDA_SUCCESS) each([&](auto sync) { ledger_.torch_.segment<sync.value>(bytes, -1); });
    return r;
  }
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override {
    const CUresult r = upstream().map(va, size, h, off);
    if (r == CUDA_SUCCESS) {
      const int64_t runs = ledger_.mapped_runs_.map(va, size);
      // Memory mapped a second time is reserved once (shared_mappings.h); its address still
      // joins or splits runs.
      const int64_t bytes = shared_.map(va, h) ? static_cast<int64_t>(size) : 0;
      each([&](auto sync) { ledger_.torch_.mapping<sync.value>(bytes, runs); });
    }
    return r;
  }
  CUresult unmap(uintptr_t va, size_t size) override {
    const CUresult r = upstream().unmap(va, size);
    if (r == CUDA_SUCCESS) {
      const int64_t runs = ledger_.mapped_runs_.unmap(va, size);
      const int64_t bytes = shared_.unmap(va) ? -static_cast<int64_t>(size) : 0;
      each([&](auto sync) { ledger_.torch_.mapping<sync.value>(bytes, runs); });
    }
    return r;
  }

 private:
  template <typename F>
  void each(F&& f) {
    using torch_stats::Sync;
    if (ledger_.keeps_records_) f(std::integral_constant<Sync, Sync::kLocked>{});
    else f(std::integral_constant<Sync, Sync::kShared>{});
  }
  DeviceLedger& ledger_;
  SharedMappings shared_;
};

DeviceLedger::DeviceLedger(int ordinal, AllocationTracker& records) : ordinal_(ordinal), records_(records) {}

DeviceLedger::~DeviceLedger() = default;

Backend& DeviceLedger::capped(Backend& upstream) {
  limited_ = std::make_unique<LimitedBackend>(upstream, budget_);
  observed_ = std::make_unique<SegmentStats>(*limited_, *this);
  return *observed_;
}

PoolFigures DeviceLedger::figures() const {
  PoolFigures f;
  const CounterSnapshot c = counters_.snapshot();
  if (pool_) pool_->figures(&f);
  // Reserved is everything held from the driver on the device: the pool's segments, and what was
  // allocated past any pool (passthrough, the driver API, the virtual-memory API, graph memory).
  // The budget counts exactly that, cap or no cap.
  // CUDA's own stream-ordered pool (passthrough) holds more than is allocated from it.
  f.reserved_bytes = held_from_driver();
  f.cuda_pools_kept_bytes = budget_.beside();
  f.peak_reserved_bytes = budget_.peak();
  f.requested_bytes = c.requested_bytes;
  f.peak_requested_bytes = c.peak_requested_bytes;
  f.ooms = ooms();  // every OOM a caller saw, pool or cap
  return f;
}

void DeviceLedger::update_cuda_pool_slack(bool peak) {
  uint64_t sum = 0;
  for (const CudaPool& p : cuda_pools_) sum += p.reserved > p.live ? p.reserved - p.live : 0;
  budget_.set_beside(sum, peak);
  uses_cuda_pools_.store(!cuda_pools_.empty(), std::memory_order_relaxed);
}

std::vector<DeviceLedger::CudaPool>::iterator DeviceLedger::find_cuda_pool(CUmemoryPool pool) {
  return std::find_if(cuda_pools_.begin(), cuda_pools_.end(), [&](const CudaPool& p) { return p.pool == pool; });
}

DeviceLedger::CudaPool& DeviceLedger::cuda_pool_entry(CUmemoryPool pool) {
  auto it = find_cuda_pool(pool);
  return it != cuda_pools_.end() ? *it : cuda_pools_.emplace_back(CudaPool{pool});
}

void DeviceLedger::note_cuda_pool_alloc(CUmemoryPool pool, uintptr_t ptr, uint64_t size) {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  cuda_pool_entry(pool).live += size;
  cuda_pool_blocks_[ptr] = pool;
  update_cuda_pool_slack();
}

CUmemoryPool DeviceLedger::note_cuda_pool_free(uintptr_t ptr, uint64_t size) {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  auto block = cuda_pool_blocks_.find(ptr);
  if (block == cuda_pool_blocks_.end()) return nullptr;
  const CUmemoryPool pool = block->second;
  cuda_pool_blocks_.erase(block);
  auto it = find_cuda_pool(pool);
  if (it == cuda_pools_.end()) return nullptr;  // forgotten meanwhile: its reservation is gone already
  it->live -= std::min(it->live, size);
  update_cuda_pool_slack(/*peak=*/false);
  return pool;
}

void DeviceLedger::note_cuda_pool_reserved(CUmemoryPool pool, uint64_t reserved) {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  cuda_pool_entry(pool).reserved = reserved;
  update_cuda_pool_slack();
}

bool DeviceLedger::note_known_cuda_pool_reserved(CUmemoryPool pool, uint64_t reserved) {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  auto it = find_cuda_pool(pool);
  if (it == cuda_pools_.end()) return false;
  it->reserved = reserved;
  update_cuda_pool_slack();
  return true;
}

std::vector<CUmemoryPool> DeviceLedger::cuda_pools() const {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  std::vector<CUmemoryPool> out;
  out.reserve(cuda_pools_.size());
  for (const CudaPool& p : cuda_pools_) out.push_back(p.pool);
  return out;
}

bool DeviceLedger::knows_cuda_pool(CUmemoryPool pool) {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  return find_cuda_pool(pool) != cuda_pools_.end();
}

bool DeviceLedger::forget_cuda_pool(CUmemoryPool pool) {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  auto it = find_cuda_pool(pool);
  if (it == cuda_pools_.end()) return false;
  cuda_pools_.erase(it);
  // Its allocations still live stay in the budget until freed, as no pool's: a new pool may get
  // the same handle.
  absl::erase_if(cuda_pool_blocks_, [&](const auto& b) { return b.second == pool; });
  update_cuda_pool_slack();
  return true;
}

void DeviceLedger::forget_cuda_pools() {
  std::lock_guard<std::mutex> lock(cuda_pools_mu_);
  cuda_pools_.clear();
  cuda_pool_blocks_.clear();
  budget_.set_beside(0, /*whole=*/false);
  uses_cuda_pools_.store(false, std::memory_order_relaxed);
}

uint64_t DeviceLedger::host_bytes() const {
  if (pool_ == nullptr) return 0;
  PoolFigures f;
  pool_->figures(&f);
  uint64_t n = f.host_bytes;
  if (keeps_records_) pool_->with_lock([&] { n += pooled_sites_.memory_bytes(); });
  return n;
}

bool DeviceLedger::find_pooled(uintptr_t ptr, AllocationRecord* rec) const {
  BlockPayload payload;
  if (keeps_records_ && pool_->find_payload(reinterpret_cast<const void*>(ptr), &payload)) {
    *rec = load_record(payload);
    return true;
  }
  return records_.find(ptr, rec) && rec->route == Route::kPooled;
}

// ---- Ledgers ----

void Ledgers::add(DeviceLedger* ledger) {
  if (ledger->pool_keeps_records()) {
    const int n = pool_count_.load(std::memory_order_relaxed);
    record_pools_[n].store(ledger, std::memory_order_release);
    pool_count_.store(n + 1, std::memory_order_release);
  }
  ledgers_[ledger->ordinal()].store(ledger, std::memory_order_release);
}

MemoryCounters* Ledgers::counters_of(MemoryKind kind, int device) {
  switch (kind) {
    case MemoryKind::kManaged: return &managed_;
    case MemoryKind::kHost: return &host_;
    case MemoryKind::kGraph: return &graph_;
    case MemoryKind::kImported: return &imported_;
    case MemoryKind::kDevice: break;
  }
  DeviceLedger* d = mutable_ledger(device);
  return d ? &d->counters_ : nullptr;
}

const MemoryCounters* Ledgers::counters(MemoryKind kind, int device) const {
  return const_cast<Ledgers*>(this)->counters_of(kind, device);
}

bool Ledgers::commit(uintptr_t ptr, const AllocationRecord& rec) {
  MemoryCounters* counters = counters_of(rec.kind, rec.device);
  if (counters == nullptr) return false;
  bool inserted = false;
  locked(rec.kind, rec.device, [&] {
    inserted = records_.insert(ptr, rec);
    if (!inserted) return;
    counters->on_alloc(rec.size, rec.requested);
    if (rec.kind == MemoryKind::kDevice) mutable_ledger(rec.device)->torch_block(rec.size, rec.requested, rec.route, +1);
  });
  return inserted;
}

void Ledgers::failed(MemoryKind kind, int device) {
  if (MemoryCounters* counters = counters_of(kind, device)) counters->on_failed();
}

bool Ledgers::forget(uintptr_t ptr, AllocationRecord* rec) {
  // Without pools that keep records no lock is needed: one lookup.
  if (pool_count_.load(std::memory_order_acquire) == 0) return records_.erase(ptr, rec);
  // The record says which lock guards its figures (the erase moves its module row). Between the
  // find and the erase another thread could free the address and have it handed out again, but
  // only to the same kind of memory on the same device (an address belongs to one device or the
  // host), whose lock is the same.
  AllocationRecord found;
  if (!records_.find(ptr, &found)) return false;
  bool erased = false;
  locked(found.kind, found.device, [&] { erased = records_.erase(ptr, rec); });
  return erased;
}

void Ledgers::restore(uintptr_t ptr, const AllocationRecord& rec) {
  locked(rec.kind, rec.device, [&] { records_.insert(ptr, rec); });
}

void Ledgers::count_free(const AllocationRecord& rec) {
  MemoryCounters* counters = counters_of(rec.kind, rec.device);
  if (counters != nullptr)
    locked(rec.kind, rec.device, [&] {
      counters->on_free(rec.size, rec.requested);
      if (rec.kind == MemoryKind::kDevice) mutable_ledger(rec.device)->torch_block(rec.size, rec.requested, rec.route, -1);
    });
  // Pooled blocks stay held by their pool (its segments are charged through capped()).
  if (rec.route == Route::kForwarded && on_device(rec.kind))
    if (DeviceLedger* d = mutable_ledger(rec.device)) d->budget_.uncharge(rec.size);
}

bool Ledgers::release(uintptr_t ptr, AllocationRecord* rec) {
  if (!forget(ptr, rec)) return false;
  count_free(*rec);
  return true;
}

std::vector<std::pair<SiteKey, SiteTotals>> Ledgers::sites() const {
  std::vector<std::pair<SiteKey, SiteTotals>> out = records_.sites();
  const int n = pool_count_.load(std::memory_order_acquire);
  if (n == 0) return out;
  const size_t tracked = out.size();
  for (int i = 0; i < n; ++i) {
    const DeviceLedger* d = record_pools_[i].load(std::memory_order_acquire);
    d->locked([&] { d->pooled_sites_.append_to(static_cast<int16_t>(d->ordinal_), MemoryKind::kDevice, &out); });
  }
  if (tracked == 0) return out;
  // A site may have both forwarded and pooled allocations live (the driver API next to cudaMalloc).
  absl::flat_hash_map<SiteKey, SiteTotals> merged;
  for (const auto& [key, totals] : out) {
    SiteTotals& t = merged[key];
    t.bytes += totals.bytes;
    t.count += totals.count;
  }
  return {merged.begin(), merged.end()};
}

}  // namespace gpushim
