// The iteration structure of a loop nobody marked: training and serving loops allocate the same
// sites in the same order every step, so the sequence of allocation sites repeats with a period
// (allocations per iteration). Each allocation stores its site in a ring (one relaxed atomic add
// and a store); when a report is written the ring is searched for the smallest period that the
// recent sequence follows, and from where it does. Nothing else is paid per allocation.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace gpushim {

struct DetectedPeriod {
  uint64_t period = 0;      // allocations per iteration; 0 = no repeating structure found
  uint64_t iterations = 0;  // iterations of that period seen (the loop's, not the warm-up's)
  // The loop's allocation sites as the ring holds them, oldest first: the first is allocation
  // number `loop_begin` of the process (from 0). When the ring wrapped inside the loop, the loop
  // began earlier than what is kept here.
  uint64_t loop_begin = 0;
  bool wrapped = false;  // the loop began before the oldest allocation kept (its start is estimated)
  std::vector<uint32_t> loop;

  static const DetectedPeriod& none() {
    static const DetectedPeriod* empty = new DetectedPeriod{};
    return *empty;
  }
};

class PeriodDetector {
 public:
  static constexpr uint64_t kRing = 1 << 14;  // the last 16384 allocations are searched

  void on_allocation(uint32_t site) {
    const uint64_t i = count_.fetch_add(1, std::memory_order_relaxed);
    ring_[i & (kRing - 1)].store(site, std::memory_order_relaxed);
  }

  // The smallest period p such that at least `min_match` of the recent allocations repeat the
  // site of the one p before, with at least 3 whole periods; pure over the ring's contents.
  DetectedPeriod detect(double min_match = 0.95) const;
  // Allocations seen so far: a growth checkpoint's place in the sequence (SitePoint::allocs).
  uint64_t allocations() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> count_{0};
  std::atomic<uint32_t> ring_[kRing] = {};
};

}  // namespace gpushim
