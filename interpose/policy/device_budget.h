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
  // The most held from the driver at any moment, with what was held beside the budget then.
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  // Bytes held from the driver that the budget does not count (what CUDA's own pools reserve
  // beyond their allocations: DeviceLedger keeps that figure). They are part of every later peak,
  // not only of the peaks taken where the figure changes: memory a pool of ours or the driver API
  // takes afterwards is held on top of them. `whole`: held() and `bytes` describe one moment (not
  // between a CUDA pool's free and the budget's uncharge, where the freed bytes are in both).
  void set_beside(uint64_t bytes, bool whole) {
    beside_.store(bytes, std::memory_order_relaxed);
    if (whole) raise(peak_, held() + bytes);
  }
  uint64_t beside() const { return beside_.load(std::memory_order_relaxed); }
  // The most held since the last reset_window_peak (or ever): CUDA's ReservedMemHigh, which a
  // program may reset; peak() is never reset.
  uint64_t window_peak() const { return window_peak_.load(std::memory_order_relaxed); }
  void reset_window_peak() {
    window_peak_.store(held(), std::memory_order_relaxed);
    raise(window_peak_, held());  // a commit racing with the store
  }

  // Before asking the driver: returns false, charging nothing, if `bytes` would take the device
  // past its limit. Must be followed by commit() (the driver gave it) or cancel() (it refused).
  // What is held beside the budget counts too, since the driver gave it (the cap is on what the
  // process holds from the driver), unless `from_beside`: an allocation from one of CUDA's own
  // pools, which that pool may serve out of what it already holds.
  bool try_charge(uint64_t bytes, bool from_beside = false) {
    const uint64_t lim = limit();
    const uint64_t others = from_beside ? 0 : beside();
    uint64_t cur = charged_.load(std::memory_order_relaxed);
    do {
      if (lim && (bytes > lim || others > lim - bytes || cur > lim - bytes - others)) return false;
    } while (!charged_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    return true;
  }
  // What the cap still allows the driver to give (0: none; UINT64_MAX: no cap).
  uint64_t room() const {
    const uint64_t lim = limit();
    if (lim == 0) return UINT64_MAX;
    const uint64_t taken = charged() + beside();
    return taken < lim ? lim - taken : 0;
  }
  // `from_beside`: the bytes came out of what is held beside the budget (an allocation from one of
  // CUDA's own pools, whose reservation is counted there until the owner reads it again), so
  // they are not added to it for the peak.
  void commit(uint64_t bytes, bool from_beside = false) {
    const uint64_t now = held_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(peak_, from_beside ? now : now + beside());
    raise(window_peak_, now);
  }
  void cancel(uint64_t bytes) { charged_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Memory given back to the driver.
  void uncharge(uint64_t bytes) {
    held_.fetch_sub(bytes, std::memory_order_relaxed);
    charged_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  // For memory already taken (its size known only afterwards): counted even past the limit.
  void charge(uint64_t bytes, bool from_beside = false) {
    charged_.fetch_add(bytes, std::memory_order_relaxed);
    commit(bytes, from_beside);
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
  std::atomic<uint64_t> beside_{0};
};

}  // namespace gpushim
