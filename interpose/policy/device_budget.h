// The per-device cap (GPUSHIM_LIMIT): one counter of bytes held from the driver, shared by
// whatever takes memory on the device (a pool's segments, or forwarded allocations under
// passthrough). try_charge is atomic, so concurrent callers can never overshoot the cap.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpushim {

class DeviceBudget {
 public:
  void set_limit(uint64_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }  // 0: none
  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

  // Returns false, charging nothing, if `bytes` would take the device past its limit.
  bool try_charge(uint64_t bytes) {
    const uint64_t lim = limit();
    uint64_t cur = held_.load(std::memory_order_relaxed);
    do {
      if (lim && (bytes > lim || cur > lim - bytes)) return false;
    } while (!held_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    raise_peak(cur + bytes);
    return true;
  }
  void uncharge(uint64_t bytes) { held_.fetch_sub(bytes, std::memory_order_relaxed); }
  // For memory already taken (its size known only afterwards): counted even past the limit.
  void charge(uint64_t bytes) {
    const uint64_t now = held_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise_peak(now);
  }

 private:
  void raise_peak(uint64_t v) {
    uint64_t p = peak_.load(std::memory_order_relaxed);
    while (v > p && !peak_.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }
  std::atomic<uint64_t> limit_{0};
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace gpushim
