// Lifetime learning for the vmm arena (VmmPoolOptions::long_fall, vmm_arena.h): which block sizes
// outlive deep falls of live memory, so that the arena places them at high addresses and the rest
// at low ones. A class of its own, apart from the arena's blocks and pieces, because it is the one
// part of the arena that looks at time (the order of allocations and frees, and live bytes over
// it) rather than at addresses: it owns its record of live bytes' lows and the votes, and knows
// nothing of where blocks lie. Not thread safe: the arena calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace gpushim {

class VmmLifetimes {
 public:
  // fall, rise: VmmPoolOptions::long_fall and long_rise; fall 0 (or less): learns nothing.
  VmmLifetimes(double fall, double rise) : fall_(fall), rise_(rise) {}

  // An allocation of a user block: its birth, to hand back to freed() (the allocation count).
  uint64_t allocated() { return ++allocs_; }
  // A user block of `size`, born at `born` with `born_live` user bytes live just after its
  // allocation, is being freed while `live` user bytes (it included) are live: it votes for its
  // size when a trough of live memory passed during its life, against otherwise.
  void freed(uint64_t born, uint64_t born_live, uint64_t size, uint64_t live);

  // Until some size has voted, nothing is known: every size is placed alike.
  bool any_votes() const { return !votes_.empty(); }
  // Some freed block has outlived a trough: in a training loop, the first step is over.
  bool seen_trough() const { return seen_trough_; }
  // Blocks of `size` are expected to outlive troughs (their votes are positive).
  bool outlives_troughs(uint64_t size) const {
    auto it = votes_.find(size);
    return it != votes_.end() && it->second > 0;
  }

  // The host memory this record holds, for the pool's host_bytes estimate.
  uint64_t host_bytes() const {
    return lows_.capacity() * sizeof(lows_[0]) + votes_.capacity() * (sizeof(uint64_t) + sizeof(int8_t) + 1);
  }

 private:
  const double fall_;
  const double rise_;
  // (allocation count, live bytes) after frees, increasing in both, so the first entry at or after
  // a block's birth holds the least live bytes since then (a min-stack: a free pops every entry
  // not below the live bytes left).
  uint64_t allocs_ = 0;
  bool seen_trough_ = false;
  std::vector<std::pair<uint64_t, uint64_t>> lows_;
  absl::flat_hash_map<uint64_t, int8_t> votes_;  // size -> votes, > 0: outlives troughs
  static constexpr size_t kMaxLows = 1 << 16;
  static constexpr size_t kMaxLongSizes = 4096;
  static constexpr int8_t kMaxVotes = 2;
};

}  // namespace gpushim
