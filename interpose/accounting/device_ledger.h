// The books of the process: one DeviceLedger per device, the single owner of that device's
// figures (its allocation records, MemoryCounters, DeviceBudget, per-site totals and module rows),
// and the Ledgers that hold them with the records of memory on no device (managed, pinned host,
// imported). Every change to those figures is one of three transactions:
//   admit    before CUDA or a pool is asked: the cap (GPUSHIM_LIMIT) charged, or the call refused;
//   commit   an allocation exists: its record kept and the figures moved;
//   release  an allocation is over: its record dropped, the figures moved back.
// The core (core/shim_inl.h) sequences them around the pool or the real call; nothing else
// writes the figures. Readers (the report, the live outputs, the memory-pool API) get const views.
//
// The lock rule, written once (DeviceLedger::locked): a device whose pool keeps the records in its
// blocks (DeviceMemoryResource::holds_payloads) has every write to its counters, its pooled sites
// and its device-memory module rows made under that pool's lock; any other device's figures are
// atomics and the tracker's shards, and need no lock of ours.
#pragma once

#include <atomic>
#include <mutex>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "accounting/memory_counters.h"
#include "accounting/pooled_records.h"
#include "accounting/pooled_sites.h"
#include "accounting/torch_stats.h"
#include "policy/backend.h"
#include "policy/device_budget.h"
#include "policy/device_memory_resource.h"
#include "util/clock.h"

namespace gpushim {

class Ledgers;

class DeviceLedger {
 public:
  DeviceLedger(int ordinal, AllocationTracker& records);
  ~DeviceLedger();
  DeviceLedger(const DeviceLedger&) = delete;
  DeviceLedger& operator=(const DeviceLedger&) = delete;

  int ordinal() const { return ordinal_; }

  // ---- set-up, before the device is published ----
  void set_limit(uint64_t bytes) { budget_.set_limit(bytes); }
  // The backend a pool takes its segments from: `upstream` under this device's cap (the pool's
  // segments are charged to the same budget as forwarded memory).
  Backend& capped(Backend& upstream);
  // The pool that serves the device (null: none). If it keeps the records, its lock is the ledger's.
  void serve_with(DeviceMemoryResource* pool) {
    pool_ = pool;
    keeps_records_ = pool != nullptr && pool->holds_payloads();
    // Non-releasable memory is known only from a pool that says where its blocks lie.
    if (pool != nullptr && !pool->places_blocks()) torch_.split_unknown();
    if (pool != nullptr) torch_.set_max_split(pool->max_split());
  }
  bool pool_keeps_records() const { return keeps_records_; }

  // ---- read-only figures ----
  const MemoryCounters& counters() const { return counters_; }
  // PyTorch's statistics of the device (torch_stats.h), kept beside the counters.
  torch_stats::Figures torch_figures() const { return torch_.snapshot(pool_ == nullptr); }
  const DeviceBudget& budget() const { return budget_; }
  uint64_t ooms() const { return ooms_.load(std::memory_order_relaxed); }
  uint64_t injected_failures() const { return injected_failures_.load(std::memory_order_relaxed); }
  // The pool's figures with the ledger's: reserved is everything held from the driver on the device.
  PoolFigures figures() const;
  // Host memory of the pool's metadata and of the sites it keeps.
  uint64_t host_bytes() const;

  // ---- the lock rule ----
  template <typename F>
  void locked(F&& f) const {
    if (keeps_records_) pool_->with_lock(f);
    else f();
  }
  // The per-site totals of the blocks whose records the pool keeps; under locked().
  void append_pooled_sites(std::vector<std::pair<SiteKey, SiteTotals>>* out) const {
    pooled_sites_.append_to(static_cast<int16_t>(ordinal_), MemoryKind::kDevice, out);
  }

  // ---- admit ----
  // Memory CUDA is about to make on the device: charged against the cap. False: refused by the
  // cap, counted as a failed allocation.
  // `from_cuda_pool`: asked of one of CUDA's own pools, which may serve it from its slack.
  bool admit(uint64_t size, bool from_cuda_pool = false) {
    if (try_admit(size, from_cuda_pool)) return true;
    counters_.on_failed();
    return false;
  }
  // admit() without counting a refusal, for a caller that may make room and ask again.
  bool try_admit(uint64_t size, bool from_cuda_pool = false) { return budget_.try_charge(size, from_cuda_pool); }
  // The admitted call answered: `made`, the memory is held from now on; otherwise the charge ends.
  // `from_cuda_pool`: allocated from one of CUDA's own pools, whose slack may have held it until
  // now (DeviceBudget::commit).
  void settle(uint64_t size, bool made, bool from_cuda_pool = false) {
    if (made) budget_.commit(size, from_cuda_pool);
    else budget_.cancel(size);
  }
  // Memory CUDA made before the ledger could be asked (its size or device known only after the
  // call). `enforce_cap`: refused (and counted failed) past the cap, the caller then undoes it;
  // otherwise held whatever the cap says.
  bool admit_made(uint64_t size, bool enforce_cap, bool from_cuda_pool = false) {
    if (!enforce_cap) {
      budget_.charge(size, from_cuda_pool);
      return true;
    }
    if (!admit(size, from_cuda_pool)) return false;
    budget_.commit(size, from_cuda_pool);
    return true;
  }
  // An allocation that failed for the caller (CUDA, a pool, or a capture refused it).
  void failed() { counters_.on_failed(); }
  // GPUSHIM_FAIL failed it on purpose.
  void failed_on_purpose() {
    counters_.on_failed();
    injected_failures_.fetch_add(1, std::memory_order_relaxed);
  }
  // An out-of-memory error the caller saw (from the pool, the cap, CUDA or GPUSHIM_FAIL).
  void count_oom() { ooms_.fetch_add(1, std::memory_order_relaxed); }

  // ---- commit and release of pooled memory ----
  // The pool hands out a block for `req`; its record (`rec`, without size and serial, and without
  // its time when `precise_time`: a trace orders events by it) is filled in and kept: in the
  // pool's block, in the same lock and lookup, where the pool keeps records; in the tracker
  // otherwise.
  CUresult pool_allocate(const AllocRequest& req, void** out, AllocationRecord& rec, bool precise_time) {
    uint64_t allocated = 0;
    if (keeps_records_) {
      PooledAlloc hooks(counters_, pooled_sites_, records_, torch_, rec, precise_time);  // fills in `rec`
      const CUresult r = pool_->allocate_with(req, out, &allocated, hooks);
      if (r != CUDA_ERROR_NOT_SUPPORTED) return r;
    }
    const CUresult r = pool_->allocate(req, out, &allocated);
    if (r != CUDA_SUCCESS) return r;
    rec.size = allocated;
    if (precise_time) rec.time_ns = now_ns();
    locked([&] {
      records_.insert(reinterpret_cast<uintptr_t>(*out), rec);
      counters_.on_alloc(allocated, rec.requested);
      torch_block(allocated, rec.requested, rec.route, +1);
    });
    return CUDA_SUCCESS;
  }
  // A free of a block whose record this device's pool keeps (pool_keeps_records()): the block and
  // its figures go back in one lock and one lookup. CUDA_ERROR_NOT_FOUND: not such a block;
  // CUDA_ERROR_NOT_PERMITTED: a block of the other kind of memory than `host_api` frees (the
  // block stays live). `*rec` is the block's record.
  CUresult release_pooled(void* ptr, CUstream stream, bool stream_ordered, bool host_api, AllocationRecord* rec) {
    PooledFree hooks(counters_, pooled_sites_, records_, torch_, host_api, rec);
    return pool_->deallocate_with(ptr, stream, stream_ordered, hooks);
  }
  // The record of a live block of this device's pool, wherever it is kept.
  bool find_pooled(uintptr_t ptr, AllocationRecord* rec) const;

  // ---- the memory-pool API's high-water marks, which a program may reset ----
  void reset_reserved_high() { budget_.reset_window_peak(); }
  void reset_used_high() { counters_.reset_window_peak(); }

  // ---- CUDA's own stream-ordered pools, where no pool of ours serves the call ----
  // A pool reserves more than is allocated from it (it grows in chunks: 32 MiB on an H100) and
  // keeps what is freed up to its release threshold: all of its reservation is held from the
  // driver. The budget holds the pool's live allocations (forwarded records); the rest of the
  // pool's reservation, its slack, is held besides: reserved as its attribute said at the last
  // reading, less the bytes the books hold allocated from it. Not the hot path: forwarded calls,
  // samples and the memory-pool API only.
  // `size` bytes at `ptr` were allocated from `pool` and are in the budget now.
  void note_cuda_pool_alloc(CUmemoryPool pool, uintptr_t ptr, uint64_t size);
  // `size` bytes at `ptr` (any forwarded device memory) are about to be freed: called before the
  // real free, since CUDA may hand the address out again at once. Returns the pool it was
  // allocated from (its slack grows by `size`, as the budget then shrinks), or null: none's. A
  // failed free gives the block back with note_cuda_pool_alloc.
  CUmemoryPool note_cuda_pool_free(uintptr_t ptr, uint64_t size);
  // `pool` reserves `reserved` bytes (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, read just now).
  void note_cuda_pool_reserved(CUmemoryPool pool, uint64_t reserved);
  // The same, read by the program itself, for a pool noted here already (false otherwise): a pool
  // the books never saw memory of holds nothing of theirs.
  bool note_known_cuda_pool_reserved(CUmemoryPool pool, uint64_t reserved);
  // Everything held from the driver on the device: the budget's bytes and the pools' slack.
  uint64_t held_from_driver() const { return budget_.held() + budget_.beside(); }
  // The pools noted so far (each exists until Shim::mempool_destroy or a reset forgets it).
  std::vector<CUmemoryPool> cuda_pools() const;
  bool knows_cuda_pool(CUmemoryPool pool);
  // `pool` was destroyed: its reservation is no longer held (what is still allocated from it is in
  // the budget until freed). False if it was not noted here.
  bool forget_cuda_pool(CUmemoryPool pool);
  // A reset destroyed the device's pools.
  void forget_cuda_pools();
  bool uses_cuda_pools() const { return uses_cuda_pools_.load(std::memory_order_relaxed); }

 private:
  friend class Ledgers;
  class SegmentStats;
  // A block whose record the tracker keeps: under the lock rule (locked()), so plain stores where
  // the pool's lock is held. Its place in a segment is not known: nor is non-releasable memory.
  void torch_block(uint64_t size, uint64_t requested, Route route, int sign) {
    using torch_stats::Sync;
    if (pool_ == nullptr) {
      // Every allocation forwarded, each its own segment: torch_figures() derives the segment
      // figures from the allocations', so only these are written (atomics: no lock is held).
      torch_.block<Sync::kShared>(size, requested, sign);
      return;
    }
    if (route != Route::kForwarded) torch_.split_unknown();
    if (keeps_records_) {
      if (route == Route::kForwarded) torch_.forwarded<Sync::kLocked>(size, requested, sign);
      else torch_.block<Sync::kLocked>(size, requested, sign);
    } else {
      if (route == Route::kForwarded) torch_.forwarded<Sync::kShared>(size, requested, sign);
      else torch_.block<Sync::kShared>(size, requested, sign);
    }
  }

  const int ordinal_;
  AllocationTracker& records_;
  MemoryCounters counters_;     // device memory handed to callers
  DeviceBudget budget_;         // bytes held from the driver, and the cap
  PooledSites pooled_sites_;    // per-site totals of blocks whose records the pool keeps
  DeviceMemoryResource* pool_ = nullptr;
  bool keeps_records_ = false;
  std::unique_ptr<Backend> limited_;  // the pool's upstream under the cap (capped())
  std::unique_ptr<Backend> observed_;  // over limited_: moves torch_'s segment figures
  torch_stats::DeviceStats torch_;
  // vmm: changed by observed_, under the pool's lock (the arena maps and unmaps under its own).
  torch_stats::MappedRuns mapped_runs_;
  std::atomic<uint64_t> ooms_{0};
  std::atomic<uint64_t> injected_failures_{0};
  struct CudaPool {
    CUmemoryPool pool;
    uint64_t reserved = 0;  // its attribute at the last reading
    uint64_t live = 0;      // bytes the books hold allocated from it
  };
  // Under cuda_pools_mu_: the pools' slack, summed, is held beside the budget (DeviceBudget::set_beside).
  // `peak`: the held figure is whole now (not between a pool's free and the budget's), so it may set the peak.
  void update_cuda_pool_slack(bool peak = true);
  // Under cuda_pools_mu_: `pool`'s entry, or end(); the entry, added if need be.
  std::vector<CudaPool>::iterator find_cuda_pool(CUmemoryPool pool);
  CudaPool& cuda_pool_entry(CUmemoryPool pool);
  mutable std::mutex cuda_pools_mu_;
  std::vector<CudaPool> cuda_pools_;  // under the mutex, as is:
  absl::flat_hash_map<uintptr_t, CUmemoryPool> cuda_pool_blocks_;  // live allocations -> their pool
  std::atomic<bool> uses_cuda_pools_{false};  // cuda_pools_ is not empty
};

// The process's books: the records of every allocation the core accounts (the tracker's map,
// plus those pools keep in their blocks), the device ledgers, and the counters of memory on no
// device of ours.
class Ledgers {
 public:
  static constexpr int kMaxDevices = 64;

  AllocationTracker& records() { return records_; }
  const AllocationTracker& records() const { return records_; }
  // A device's ledger, listed once it is created and before it is published: whoever can reach
  // the device (and so hold a record of it) then also sees that its pool keeps records.
  void add(DeviceLedger* ledger);
  const DeviceLedger* ledger(int ordinal) const {
    return ordinal >= 0 && ordinal < kMaxDevices ? ledgers_[ordinal].load(std::memory_order_acquire) : nullptr;
  }
  // The counters of `kind` memory on `device` (null: a device never seen).
  const MemoryCounters* counters(MemoryKind kind, int device) const;

  // ---- commit ----
  // An allocation whose record the tracker keeps (forwarded memory, and blocks of pools that keep
  // none): recorded and counted. False if `ptr` was live already (then nothing changes).
  bool commit(uintptr_t ptr, const AllocationRecord& rec);
  // A call that failed for the caller, counted in the figures of its kind (the device's ledger
  // for device memory: see DeviceLedger::failed).
  void failed(MemoryKind kind, int device);

  // ---- release ----
  // A free of a block whose record its pool keeps, asked of every such pool; see
  // DeviceLedger::release_pooled. `*owner`: the device whose pool answered.
  CUresult release_pooled(void* ptr, CUstream stream, bool stream_ordered, bool host_api, AllocationRecord* rec,
                          DeviceLedger** owner) {
    for (int i = 0, n = pool_count_.load(std::memory_order_acquire); i < n; ++i) {
      DeviceLedger* d = record_pools_[i].load(std::memory_order_acquire);
      const CUresult r = d->release_pooled(ptr, stream, stream_ordered, host_api, rec);
      if (r == CUDA_ERROR_NOT_FOUND) continue;
      *owner = d;
      return r;
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  // Forgets `ptr` before its memory goes (CUDA may hand the address out again at once); its
  // figures move with count_free once it is gone, or the record comes back with restore.
  bool forget(uintptr_t ptr, AllocationRecord* rec);
  void restore(uintptr_t ptr, const AllocationRecord& rec);
  // The memory of a forgotten record is gone: its figures move, and forwarded device memory is no
  // longer held from the driver.
  void count_free(const AllocationRecord& rec);
  // forget + count_free, for memory already gone (virtual memory released, a context destroyed).
  bool release(uintptr_t ptr, AllocationRecord* rec);

  // ---- reads ----
  // Live totals per site, wherever the records are kept.
  std::vector<std::pair<SiteKey, SiteTotals>> sites() const;
  bool any_pool_keeps_records() const { return pool_count_.load(std::memory_order_acquire) != 0; }

 private:
  DeviceLedger* mutable_ledger(int ordinal) const {
    return ordinal >= 0 && ordinal < kMaxDevices ? ledgers_[ordinal].load(std::memory_order_acquire) : nullptr;
  }
  MemoryCounters* counters_of(MemoryKind kind, int device);
  // Runs `f` under the lock that guards the figures of `kind` memory on `device` (the rule above).
  template <typename F>
  void locked(MemoryKind kind, int device, F&& f) const {
    const DeviceLedger* d =
        kind == MemoryKind::kDevice && pool_count_.load(std::memory_order_relaxed) != 0 ? ledger(device) : nullptr;
    if (d != nullptr) d->locked(f);
    else f();
  }

  AllocationTracker records_;
  std::atomic<DeviceLedger*> ledgers_[kMaxDevices] = {};
  // The ledgers whose pools keep their records, in creation order: a free asks each of them first.
  std::atomic<DeviceLedger*> record_pools_[kMaxDevices] = {};
  std::atomic<int> pool_count_{0};
  MemoryCounters managed_;
  MemoryCounters host_;
  MemoryCounters graph_;
  MemoryCounters imported_;
};

}  // namespace gpushim
