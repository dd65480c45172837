// The private contract between a DeviceLedger and a pool that keeps the allocation records itself
// (DeviceMemoryResource::holds_payloads): the hooks the pool calls under its lock. The record
// goes into the block, and the device's counters, its per-site totals and the caller module's row
// move in the same critical section. Every other writer of those figures takes the same lock
// (DeviceLedger::locked), which is what lets them be plain loads and stores here. Only
// accounting/device_ledger.h (and its unit test) uses these.
#pragma once

#include <cstddef>
#include <cstring>

#include "accounting/allocation_tracker.h"
#include "accounting/memory_counters.h"
#include "accounting/pooled_sites.h"
#include "accounting/torch_stats.h"
#include "policy/device_memory_resource.h"
#include "util/clock.h"

namespace gpushim {

static_assert(sizeof(AllocationRecord) <= BlockPayload::kBytes, "the record travels in the pool's block");

inline void store_record(const AllocationRecord& rec, BlockPayload& out) { std::memcpy(out.bytes, &rec, sizeof rec); }
// Writes one field of the record kept in `out`.
template <typename T>
inline void store_field(BlockPayload& out, size_t offset, T value) {
  std::memcpy(out.bytes + offset, &value, sizeof value);
}
inline AllocationRecord load_record(const BlockPayload& in) {
  AllocationRecord rec;
  std::memcpy(&rec, in.bytes, sizeof rec);
  return rec;
}

// What a pooled allocation moves. `rec`, the caller's, comes without size and serial (the pool
// decides the one, the sites the other) and, when `precise_time`, without its time: a trace
// orders events by it, so it is read under the lock, in the pool's order. They are filled in,
// in `rec` and in the block, when the pool hands a block out.
class PooledAlloc final : public PayloadHooks {
 public:
  PooledAlloc(MemoryCounters& counters, PooledSites& sites, AllocationTracker& tracker,
              torch_stats::DeviceStats& torch, AllocationRecord& rec, bool precise_time)
      : counters_(counters), sites_(sites), tracker_(tracker), torch_(torch), rec_(rec), precise_time_(precise_time) {}

  void on_allocated(uintptr_t, uint64_t bytes, BlockPayload& payload, const BlockPlace* place) override {
    // The record is copied whole first and its new fields written into the copy after: copying
    // it right after writing them would read back fresh narrow stores with wide loads, which
    // stalls the store forwarding (measured: a few ns of every pair).
    store_record(rec_, payload);
    rec_.size = bytes;
    rec_.serial = sites_.next_serial();
    store_field(payload, offsetof(AllocationRecord, size), rec_.size);
    store_field(payload, offsetof(AllocationRecord, serial), rec_.serial);
    if (precise_time_) {
      rec_.time_ns = now_ns();
      store_field(payload, offsetof(AllocationRecord, time_ns), rec_.time_ns);
    }
    sites_.add(rec_.stack, bytes);
    tracker_.module_row(rec_).on_alloc_locked(bytes);
    counters_.on_alloc_locked(bytes, rec_.requested);
    torch_.block<torch_stats::Sync::kLocked>(bytes, rec_.requested, +1);
    if (place != nullptr)
      torch_.split<torch_stats::Sync::kLocked>(torch_stats::segment_pool(place->segment_size),
                                               torch_stats::split_on_alloc(bytes, *place));
  }
  bool on_freeing(uintptr_t, uint64_t, const BlockPayload&, const BlockPlace*) override { return false; }

  const AllocationRecord& record() const { return rec_; }

 private:
  MemoryCounters& counters_;
  PooledSites& sites_;
  AllocationTracker& tracker_;
  torch_stats::DeviceStats& torch_;
  AllocationRecord& rec_;
  const bool precise_time_;
};

// What a pooled free moves. Refuses the free when the record is of the other kind of memory than
// the free function takes (`host_api`: cudaFreeHost and the like): CUDA would refuse it too.
class PooledFree final : public PayloadHooks {
 public:
  // The record is read into `*out` when given (no copy on the free path), else kept here.
  PooledFree(MemoryCounters& counters, PooledSites& sites, AllocationTracker& tracker, torch_stats::DeviceStats& torch,
             bool host_api, AllocationRecord* out = nullptr)
      : counters_(counters), sites_(sites), tracker_(tracker), torch_(torch), rec_(out ? *out : own_), host_api_(host_api) {}

  void on_allocated(uintptr_t, uint64_t, BlockPayload&, const BlockPlace*) override {}
  bool on_freeing(uintptr_t, uint64_t, const BlockPayload& payload, const BlockPlace* place) override {
    rec_ = load_record(payload);
    if (host_api_ != (rec_.kind == MemoryKind::kHost)) return false;
    sites_.remove(rec_.stack, rec_.size);
    tracker_.module_row(rec_).on_free_locked(rec_.size);
    counters_.on_free_locked(rec_.size, rec_.requested);
    torch_.block<torch_stats::Sync::kLocked>(rec_.size, rec_.requested, -1);
    if (place != nullptr)
      torch_.split<torch_stats::Sync::kLocked>(torch_stats::segment_pool(place->segment_size),
                                               torch_stats::split_on_free(rec_.size, *place));
    return true;
  }

  // The freed (or refused) allocation's record.
  const AllocationRecord& record() const { return rec_; }

 private:
  MemoryCounters& counters_;
  PooledSites& sites_;
  AllocationTracker& tracker_;
  torch_stats::DeviceStats& torch_;
  AllocationRecord own_;
  AllocationRecord& rec_;
  const bool host_api_;
};

}  // namespace gpushim
