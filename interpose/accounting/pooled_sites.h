// Per-site totals and serials of one device's pooled allocations, whose records live in the pool's
// blocks (BlockPayload) rather than in AllocationTracker: the pool's hooks move them in the same
// critical section as the block, so an alloc+free pair takes one lock and one pointer lookup.
//
// Not thread-safe on its own: every call is made under the device's pool lock (in PayloadHooks,
// or through DeviceMemoryResource::with_lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"

namespace gpushim {

class PooledSites {
 public:
  // Distinct for every pooled allocation of this device (until 2^32 more), like the tracker's.
  uint32_t next_serial() { return ++serial_ != 0 ? serial_ : ++serial_; }

  void add(StackId stack, uint64_t bytes) {
    SiteTotals& t = site(stack);
    t.bytes += bytes;
    t.count += 1;
    ++live_;
  }
  void remove(StackId stack, uint64_t bytes) {
    --live_;
    SiteTotals* t = last_ != nullptr && last_stack_ == stack ? last_ : nullptr;
    if (t == nullptr) {
      auto it = sites_.find(stack);
      if (it == sites_.end()) return;
      t = &it->second;
    }
    t->bytes -= bytes;
    t->count -= 1;
    // Emptied sites are dropped in batches, as in AllocationTracker (which says why).
    if (t->count == 0 && ++empty_ > live_ + kEmptySitesKept) sweep();
  }
  // Appends the non-empty sites as (stack, device, kind) keys.
  void append_to(int16_t device, MemoryKind kind, std::vector<std::pair<SiteKey, SiteTotals>>* out) const {
    for (const auto& [stack, totals] : sites_)
      if (totals.count != 0) out->emplace_back(SiteKey{stack, device, kind}, totals);
  }
  size_t memory_bytes() const { return sites_.capacity() * (sizeof(StackId) + sizeof(SiteTotals) + 1); }

 private:
  static constexpr size_t kEmptySitesKept = 64;
  // A loop allocates and frees at the same site over and over: the last site used is kept, so
  // that most calls skip the hash lookup. An element's address is stable until an insert
  // rehashes the map (that insert then becomes the last site) or a sweep erases it.
  SiteTotals& site(StackId stack) {
    if (last_ != nullptr && last_stack_ == stack) return *last_;
    last_ = &sites_[stack];
    last_stack_ = stack;
    return *last_;
  }
  void sweep() {
    absl::erase_if(sites_, [](const auto& kv) { return kv.second.count == 0; });
    empty_ = 0;
    last_ = nullptr;
  }

  absl::flat_hash_map<StackId, SiteTotals> sites_;
  uint64_t live_ = 0;
  size_t empty_ = 0;
  uint32_t serial_ = 0;
  SiteTotals* last_ = nullptr;
  StackId last_stack_ = kEmptyStack;
};

}  // namespace gpushim
