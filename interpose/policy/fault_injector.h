// GPUSHIM_FAIL's decision: should this device allocation fail on purpose? The core asks before
// any pool or forwarding serves the request, so an injected failure costs the device nothing and
// reaches the caller exactly like a real out-of-memory error. Lock-free: one atomic increment per
// allocation while active, one relaxed load when not.
#pragma once

#include <atomic>
#include <cstdint>

#include "config/fault_spec.h"

namespace gpushim {

class FaultInjector {
 public:
  explicit FaultInjector(FaultSpec spec);

  bool active() const { return active_; }
  // Counts one allocation request of `size` bytes. Returns its number (1-based, process-wide) if
  // it must fail, 0 if it may proceed.
  uint64_t select(uint64_t size);
  // How many allocations were counted, and how many of them were failed on purpose.
  uint64_t counted() const { return counted_.load(std::memory_order_relaxed); }
  uint64_t injected() const { return injected_.load(std::memory_order_relaxed); }
  const FaultSpec& spec() const { return spec_; }

 private:
  bool selects(uint64_t number, uint64_t size) const;

  const FaultSpec spec_;
  const bool active_;
  uint64_t probability_threshold_ = 0;  // random: fail when the 64-bit draw is below this
  std::atomic<uint64_t> counted_{0};
  std::atomic<uint64_t> injected_{0};
};

}  // namespace gpushim
