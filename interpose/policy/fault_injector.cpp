#include "policy/fault_injector.h"

#include <cmath>

namespace gpushim {
namespace {

// SplitMix64's finalizer: a well-mixed 64-bit draw from (seed, allocation number), so the
// decision for the Nth allocation never depends on which thread made it or on earlier draws.
uint64_t draw(uint64_t seed, uint64_t number) {
  uint64_t z = seed + number * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

FaultInjector::FaultInjector(FaultSpec spec) : spec_(std::move(spec)), active_(spec_.active()) {
  if (spec_.probability >= 1) {
    probability_threshold_ = UINT64_MAX;
  } else if (spec_.probability > 0) {
    // p * 2^64, computed in long double so that small probabilities keep their precision.
    probability_threshold_ = static_cast<uint64_t>(std::ldexp(static_cast<long double>(spec_.probability), 64));
  }
}

bool FaultInjector::selects(uint64_t number, uint64_t size) const {
  if (size > spec_.above) return true;
  if (spec_.every != 0 && number % spec_.every == 0) return true;
  for (uint64_t n : spec_.nth)
    if (n == number) return true;
  if (probability_threshold_ == UINT64_MAX) return true;
  return probability_threshold_ != 0 && draw(spec_.seed, number) < probability_threshold_;
}

uint64_t FaultInjector::select(uint64_t size) {
  if (!active_) return 0;
  const uint64_t number = counted_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!selects(number, size)) return 0;
  injected_.fetch_add(1, std::memory_order_relaxed);
  return number;
}

}  // namespace gpushim
