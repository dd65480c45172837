// PyTorch-style statistics of one device (torch.cuda.memory_stats(), c10/cuda/CUDACachingAllocator's
// DeviceStats): one definition of each figure, kept by the core as it accounts (DeviceLedger) and
// computed by gpushim-analyze from a trace's events (analysis/torch_summary.cpp) with the same
// rules, so that a run's report and its trace give the same table.
//
// What each figure means for our pools (PyTorch's meaning first):
//   allocation, allocated_bytes   blocks handed out (policy-rounded bytes). Forwarded memory
//                                 (passthrough, requests a pool sends to CUDA) counts too.
//   requested_bytes               what callers asked for.
//   active, active_bytes          PyTorch: allocated plus freed blocks still waiting for their
//                                 streams (record_stream). Here the same as allocated: a block is
//                                 inactive from its free on, whatever the pool's reuse rules then
//                                 wait for before handing it out again.
//   segment, reserved_bytes       memory held from the driver: a pool's segments (caching), its
//                                 runs of adjacent mappings, as PyTorch's expandable segments grow
//                                 (vmm; memory mapped at two addresses is reserved once,
//                                 policy/shared_mappings.h), and every forwarded allocation as a
//                                 segment of its own.
//   inactive_split(_bytes)        "non-releasable": the free pieces of segments still partly in
//                                 use (PyTorch: free blocks that are split). Kept by the core only
//                                 where the pool tells each block's place in its segment
//                                 (DeviceMemoryResource::places_blocks: the caching pool);
//                                 under passthrough always zero (every segment is one block).
//   oversize_*                    blocks and segments of at least max_split_size: the caching
//                                 pool's GPUSHIM_MAX_SPLIT (DeviceMemoryResource::max_split);
//                                 zero without it, as in PyTorch's default.
// The vmm policy's arena does not place its blocks: its report has no inactive_split figures
// (a trace has them, from the mapped runs and the blocks inside). Placing them in the core would
// need an ordered index of live blocks, a node allocation on every allocation.
// Pools: a block of at most 1 MiB (PyTorch's kSmallSize) is small, a segment of at most 2 MiB
// (kSmallBuffer) is small; a forwarded allocation's segment is in its block's pool.
//
// Hot path: no allocation and no lock of its own. A device whose pool keeps the records updates
// under the pool's lock (plain loads and stores, Sync::kLocked); otherwise (passthrough) each
// figure is an atomic read-modify-write (Sync::kShared), three metrics per allocation and free.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <map>

#include "policy/block_place.h"

namespace gpushim::torch_stats {

constexpr uint64_t kSmallBlock = 1ull << 20;    // PyTorch's kSmallSize
constexpr uint64_t kSmallSegment = 2ull << 20;  // PyTorch's kSmallBuffer

enum Pool { kAll, kLarge, kSmall, kPools };
// memory_stats()'s names, in its order.
enum Metric {
  kAllocation,
  kSegment,
  kActive,
  kInactiveSplit,
  kAllocatedBytes,
  kReservedBytes,
  kActiveBytes,
  kInactiveSplitBytes,
  kRequestedBytes,
  kMetrics
};
inline const char* metric_name(int m) {
  static const char* kNames[kMetrics] = {"allocation",     "segment",        "active",
                                         "inactive_split", "allocated_bytes", "reserved_bytes",
                                         "active_bytes",   "inactive_split_bytes", "requested_bytes"};
  return kNames[m];
}
inline const char* pool_name(int p) {
  static const char* kNames[kPools] = {"all", "large_pool", "small_pool"};
  return kNames[p];
}

inline Pool block_pool(uint64_t size) { return size <= kSmallBlock ? kSmall : kLarge; }
inline Pool segment_pool(uint64_t size) { return size <= kSmallSegment ? kSmall : kLarge; }

// One statistic: its current value, its peak, and the totals of its rises and falls.
struct Values {
  uint64_t current = 0, peak = 0, allocated = 0, freed = 0;
  bool operator==(const Values& o) const {
    return current == o.current && peak == o.peak && allocated == o.allocated && freed == o.freed;
  }
};

// Every statistic of a device, read at one moment. `split_known`: the inactive_split figures were
// kept (see above); otherwise they are zero and mean nothing.
struct Figures {
  Values stat[kMetrics][kPools];
  Values oversize_allocations, oversize_segments;
  bool split_known = true;
};

// How a block's arrival or departure changes the free pieces of its segment, from the block's
// place there: whether free space lies right before and right after it, and whether the segment
// holds no other block (then its free space is releasable, not counted).
using Place = BlockPlace;
struct SplitChange {
  int64_t bytes = 0, pieces = 0;
};
inline SplitChange split_on_alloc(uint64_t size, const Place& p) {
  const int64_t pieces = int64_t{p.gap_before} + int64_t{p.gap_after};
  if (p.alone) return {static_cast<int64_t>(p.segment_size) - static_cast<int64_t>(size), pieces};
  return {-static_cast<int64_t>(size), pieces - 1};  // carved out of one free piece
}
// `p` as the segment is with the block still in it, its gaps being the free space beside it.
inline SplitChange split_on_free(uint64_t size, const Place& p) {
  const SplitChange a = split_on_alloc(size, p);
  return {-a.bytes, -a.pieces};
}

enum class Sync { kLocked, kShared };

// One statistic of one pool: its current value, its peak and the total of its rises. The total of
// its falls is the difference (current = rises - falls), so a fall writes one figure.
class Stat {
 public:
  // Returns the new current value.
  template <Sync S>
  uint64_t add(int64_t d) {
    if constexpr (S == Sync::kLocked) {
      const uint64_t cur = cur_.load(std::memory_order_relaxed);
      if (d < 0) {
        // Never below zero: an event lost from a trace must not wrap the figure around.
        const uint64_t now = cur - std::min(cur, static_cast<uint64_t>(-d));
        cur_.store(now, std::memory_order_relaxed);
        return now;
      }
      const uint64_t now = cur + static_cast<uint64_t>(d);
      // The rises before the current value, which publishes them (values() reads in reverse).
      up_.store(up_.load(std::memory_order_relaxed) + static_cast<uint64_t>(d), std::memory_order_relaxed);
      cur_.store(now, std::memory_order_release);
      if (now > peak_.load(std::memory_order_relaxed)) peak_.store(now, std::memory_order_relaxed);
      return now;
    } else {
      if (d < 0) return cur_.fetch_sub(static_cast<uint64_t>(-d), std::memory_order_relaxed) - static_cast<uint64_t>(-d);
      up_.fetch_add(static_cast<uint64_t>(d), std::memory_order_relaxed);
      const uint64_t now = cur_.fetch_add(static_cast<uint64_t>(d), std::memory_order_release) + static_cast<uint64_t>(d);
      raise<S>(peak_, now);
      return now;
    }
  }
  uint64_t current() const { return cur_.load(std::memory_order_relaxed); }
  Values values() const {
    // Current first, with acquire: the rises written before it (add) are then all seen, so freed
    // (rises - current) is never short of a rise a concurrent reader (a snapshot) saw in current.
    const uint64_t cur = cur_.load(std::memory_order_acquire);
    const uint64_t up = up_.load(std::memory_order_relaxed);
    return Values{cur, peak_.load(std::memory_order_relaxed), up, up - std::min(up, cur)};
  }

  template <Sync S>
  static void raise(std::atomic<uint64_t>& max, uint64_t v) {
    uint64_t m = max.load(std::memory_order_relaxed);
    if constexpr (S == Sync::kLocked) {
      if (v > m) max.store(v, std::memory_order_relaxed);
    } else {
      while (v > m && !max.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
      }
    }
  }

 private:
  std::atomic<uint64_t> cur_{0}, peak_{0}, up_{0};
};

// The statistics of one device. Kept per pool; the "all" row is their sum, with a peak of its
// own. Active figures are the allocated ones (see above), so they are not kept twice.
class DeviceStats {
 public:
  // A block handed out (`sign` +1) or freed (-1): `size` policy-rounded, `requested` asked for.
  template <Sync S>
  void block(uint64_t size, uint64_t requested, int sign) {
    const Pool pool = block_pool(size);
    add<S>(kAllocatedBytes, pool, sign * static_cast<int64_t>(size));
    add<S>(kRequestedBytes, pool, sign * static_cast<int64_t>(requested));
    add<S>(kAllocation, pool, sign);
    if (size >= max_split_) oversize_allocations_.add<S>(sign);
  }
  // A forwarded allocation (CUDA's own memory): a block in a segment of its own, wholly in use.
  template <Sync S>
  void forwarded(uint64_t size, uint64_t requested, int sign) {
    block<S>(size, requested, sign);
    const Pool pool = block_pool(size);
    add<S>(kReservedBytes, pool, sign * static_cast<int64_t>(size));
    add<S>(kSegment, pool, sign);
    if (size >= max_split_) oversize_segments_.add<S>(sign);
  }
  // A pool's segment taken from (+1) or given back to (-1) the driver.
  template <Sync S>
  void segment(uint64_t size, int sign) {
    const Pool pool = segment_pool(size);
    add<S>(kReservedBytes, pool, sign * static_cast<int64_t>(size));
    add<S>(kSegment, pool, sign);
    if (size >= max_split_) oversize_segments_.add<S>(sign);
  }
  // Mapped bytes (vmm), with the change in the number of runs of adjacent mappings (MappedRuns).
  template <Sync S>
  void mapping(int64_t bytes, int64_t runs) {
    add<S>(kReservedBytes, kLarge, bytes);
    add<S>(kSegment, kLarge, runs);
  }
  // Free pieces of a segment of `pool` that a block entered or left.
  template <Sync S>
  void split(Pool pool, SplitChange c) {
    add<S>(kInactiveSplitBytes, pool, c.bytes);
    add<S>(kInactiveSplit, pool, c.pieces);
  }
  // Blocks and segments at least this large are oversize (set up before the first block).
  void set_max_split(uint64_t bytes) { max_split_ = bytes; }
  // A block came without its place: the inactive_split figures are no longer known.
  void split_unknown() { split_known_.store(false, std::memory_order_relaxed); }

  // `only_forwarded`: every block was forwarded() but counted with block() alone (a device
  // without a pool, where each allocation is its own segment): segments and reserved bytes are
  // then the allocations' figures, so the hot path writes them once.
  Figures snapshot(bool only_forwarded = false) const {
    Figures f;
    for (int m = 0; m < kMetrics; ++m) {
      Values& all = f.stat[m][kAll];
      for (int p : {kLarge, kSmall}) {
        f.stat[m][p] = stat_[m][p].values();
        all.current += f.stat[m][p].current, all.allocated += f.stat[m][p].allocated, all.freed += f.stat[m][p].freed;
      }
      all.peak = all_peak_[m].load(std::memory_order_relaxed);
    }
    for (int p = 0; p < kPools; ++p) {
      f.stat[kActive][p] = f.stat[kAllocation][p];
      f.stat[kActiveBytes][p] = f.stat[kAllocatedBytes][p];
      if (only_forwarded) {
        f.stat[kSegment][p] = f.stat[kAllocation][p];
        f.stat[kReservedBytes][p] = f.stat[kAllocatedBytes][p];
      }
    }
    f.oversize_allocations = oversize_allocations_.values();
    f.oversize_segments = oversize_segments_.values();
    f.split_known = split_known_.load(std::memory_order_relaxed);
    return f;
  }

 private:
  template <Sync S>
  void add(Metric m, Pool pool, int64_t d) {
    if (d == 0) return;
    const uint64_t now = stat_[m][pool].add<S>(d);
    if (d > 0) Stat::raise<S>(all_peak_[m], now + stat_[m][pool == kLarge ? kSmall : kLarge].current());
  }
  Stat stat_[kMetrics][kPools];  // [kAll] unused: the sum of the others
  std::atomic<uint64_t> all_peak_[kMetrics] = {};
  Stat oversize_allocations_, oversize_segments_;
  uint64_t max_split_ = UINT64_MAX;
  std::atomic<bool> split_known_{true};
};

// Runs of adjacent mappings (vmm), counted as segments the way PyTorch's expandable segments
// grow: a mapping next to a run extends it, one between two runs joins them, an unmapping in the
// middle of a run splits it. map/unmap return the change in the number of runs. Changes only
// where the driver is called (never on an allocation's path), so its node allocations are fine.
class MappedRuns {
 public:
  int64_t map(uint64_t addr, uint64_t size) {
    int64_t delta = 1;
    uint64_t base = addr, end = addr + size;
    auto after = runs_.find(end);
    if (after != runs_.end()) {
      end = after->second;
      runs_.erase(after);
      --delta;
    }
    auto it = runs_.lower_bound(addr);
    if (it != runs_.begin() && std::prev(it)->second == addr) {
      std::prev(it)->second = end;
      return delta - 1;
    }
    runs_[base] = end;
    return delta;
  }
  int64_t unmap(uint64_t addr, uint64_t size) {
    auto it = runs_.upper_bound(addr);
    if (it == runs_.begin()) return 0;
    --it;
    const uint64_t base = it->first, end = it->second;
    if (addr + size > end) return 0;  // not inside one run: a mapping we never saw
    runs_.erase(it);
    int64_t delta = -1;
    if (base < addr) runs_[base] = addr, ++delta;
    if (addr + size < end) runs_[addr + size] = end, ++delta;
    return delta;
  }
  // The run holding [addr, addr + size): its base and end, or false.
  bool containing(uint64_t addr, uint64_t size, uint64_t* base, uint64_t* end) const {
    auto it = runs_.upper_bound(addr);
    if (it == runs_.begin()) return false;
    --it;
    if (addr + size > it->second) return false;
    *base = it->first, *end = it->second;
    return true;
  }

 private:
  std::map<uint64_t, uint64_t> runs_;  // base -> end
};

}  // namespace gpushim::torch_stats
