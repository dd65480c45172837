// The per-device cap (GPUSHIM_LIMIT): one counter of bytes held from the driver, shared by
// whatever takes memory on the device (a pool's segments, or forwarded allocations under
// passthrough). try_charge is atomic, so concurrent callers can never overshoot the cap.
// Charging happens before the driver is asked, committing after it answered yes.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpushim {

class DeviceBudget {
 public:
  void set_limit(uint64_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }  // 0: none
  // Bytes held from the driver plus those being asked for right now: what the cap is checked
  // against, so that concurrent callers can never overshoot it together.
  uint64_t charged() const { return charged_.load(std::memory_order_relaxed); }
  // Bytes the driver actually handed over and we still hold: "reserved". An attempt the driver
  // refuses never shows here, so the peak never exceeds what the device really gave us.
  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  // The most held since the last reset_window_peak (or ever): CUDA's ReservedMemHigh, which a
  // program may reset; peak() is never reset.
  uint64_t window_peak() const { return window_peak_.load(std::memory_order_relaxed); }
  void reset_window_peak() {
    window_peak_.store(held(), std::memory_order_relaxed);
    raise(window_peak_, held());  // a commit racing with the store
  }

  // Before asking the driver: returns false, charging nothing, if `bytes` would take the device
  // past its limit. Must be followed by commit() (the driver gave it) or cancel() (it refused).
  bool try_charge(uint64_t bytes) {
    const uint64_t lim = limit();
    uint64_t cur = charged_.load(std::memory_order_relaxed);
    do {
      if (lim && (bytes > lim || cur > lim - bytes)) return false;
    } while (!charged_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    return true;
  }
  void commit(uint64_t bytes) {
    const uint64_t now = held_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(peak_, now);
    raise(window_peak_, now);
  }
  void cancel(uint64_t bytes) { charged_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Memory given back to the driver.
  void uncharge(uint64_t bytes) {
    held_.fetch_sub(bytes, std::memory_order_relaxed);
    charged_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  // For memory already taken (its size known only afterwards): counted even past the limit.
  void charge(uint64_t bytes) {
    charged_.fetch_add(bytes, std::memory_order_relaxed);
    commit(bytes);
  }

 private:
  static void raise(std::atomic<uint64_t>& peak, uint64_t v) {
    uint64_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }
  std::atomic<uint64_t> limit_{0};
  std::atomic<uint64_t> charged_{0};
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> window_peak_{0};
};

}  // namespace gpushim
