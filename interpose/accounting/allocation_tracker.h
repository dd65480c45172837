// The live-allocation map: pointer -> what we know about it. The single owner of per-allocation
// metadata (size, requested size, stack, device, kind). Policies keep their own block structure;
// this map is what the report, the site table and invalid-free detection read.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "accounting/memory_kind.h"
#include "accounting/module_counters.h"
#include "stacks/module_map.h"
#include "stacks/stack_table.h"

namespace gpushim {

// How an allocation was served, so that the free goes back the same way.
enum class Route : uint8_t {
  kForwarded = 0,   // passed to the real runtime/driver; free forwards too
  kPooled = 1,      // served by the policy's pool
};

struct AllocationRecord {
  uint64_t size = 0;        // bytes it occupies under the policy (rounded): "allocated"
  uint64_t requested = 0;   // bytes the caller asked for
  // When it was allocated. Precise (now_ns) while a trace is recorded, which orders events by it;
  // otherwise the allocation path reads the coarse clock (coarse_now_ns): nothing else needs better.
  uint64_t time_ns = 0;
  StackId stack = kEmptyStack;
  int16_t device = 0;
  MemoryKind kind = MemoryKind::kDevice;
  Route route = Route::kForwarded;
  ModuleId module = kUnknownModule;  // the library that called into CUDA
  // Set by AllocationTracker::insert: distinct for every allocation made at the same address
  // (until 2^32 more allocations reuse it), which the coarse time_ns is not. Costs no space: it
  // fills the record's padding.
  uint32_t serial = 0;
};
static_assert(sizeof(AllocationRecord) == 40, "the live map holds one per allocation: keep it small");

struct SiteKey {
  StackId stack;
  int16_t device;
  MemoryKind kind;
  bool operator==(const SiteKey& o) const { return stack == o.stack && device == o.device && kind == o.kind; }
  template <typename H>
  friend H AbslHashValue(H h, const SiteKey& k) {
    return H::combine(std::move(h), k.stack, k.device, static_cast<uint8_t>(k.kind));
  }
};

struct SiteTotals {
  uint64_t bytes = 0;
  uint64_t count = 0;
};

class AllocationTracker {
 public:
  AllocationTracker();
  AllocationTracker(const AllocationTracker&) = delete;
  AllocationTracker& operator=(const AllocationTracker&) = delete;

  // Returns false (and records nothing) if `ptr` is already live: our view would be wrong.
  // A new record (serial 0) gets its serial here; one put back after a refused free keeps its own.
  bool insert(uintptr_t ptr, const AllocationRecord& rec);
  // Removes `ptr`; returns false if it was not live.
  bool erase(uintptr_t ptr, AllocationRecord* out);
  bool find(uintptr_t ptr, AllocationRecord* out) const;

  // Live totals per site (stack, device, kind), merged across shards.
  std::vector<std::pair<SiteKey, SiteTotals>> sites() const;
  // Every live allocation (for snapshots and exports).
  std::vector<std::pair<uintptr_t, AllocationRecord>> live() const;
  size_t live_count() const;
  size_t memory_bytes() const;
  // Live/peak/total per (module, device, kind), moved by insert and erase.
  const ModuleCounters& modules() const { return modules_; }
  // The row `rec` counts in, for allocations whose records live elsewhere (a pool's blocks; see
  // PooledSites): the table stays one, so the report's rows and peaks stay exact.
  ModuleTotals& module_row(const AllocationRecord& rec) { return module_counters(rec); }

  void lock_all_for_fork();
  void unlock_all_after_fork();

 private:
  static constexpr unsigned kShards = 16;
  struct Shard {
    mutable std::mutex mu;
    absl::flat_hash_map<uintptr_t, AllocationRecord> live;
    absl::flat_hash_map<SiteKey, SiteTotals> sites;
    uint32_t serial = 0;  // of the last insert; a pointer always maps to the same shard
    size_t empty_sites = 0;  // sites whose count reached 0 since the last sweep (an upper bound)
  };
  // Empty sites a shard may keep beyond its live allocations before they are swept out.
  static constexpr size_t kEmptySitesKept = 64;
  static void sweep_empty_sites(Shard& s);  // requires s.mu
  Shard& shard_for(uintptr_t p) const {
    // Device pointers are aligned, so mix the bits before picking a shard.
    uint64_t h = p * 0x9E3779B97F4A7C15ull;
    return shards_[h >> 60];
  }
  ModuleTotals& module_counters(const AllocationRecord& rec);

  std::unique_ptr<Shard[]> shards_;
  ModuleCounters modules_;
};

}  // namespace gpushim
