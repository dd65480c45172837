// Exact, lock-free counters for one kind of memory on one device.
//
// Updated on every allocation and free from any thread; exact because every update is one atomic
// read-modify-write, and the peak is raised with a CAS loop right after the live total moves.
// The live count is allocations minus frees rather than a counter of its own: one atomic
// read-modify-write less each way on the hot path.
#pragma once

#include <atomic>
#include <cstdint>

#include "util/clock.h"

namespace gpushim {

struct CounterSnapshot {
  uint64_t live_bytes = 0;
  uint64_t live_count = 0;
  uint64_t requested_bytes = 0;
  uint64_t peak_bytes = 0;
  uint64_t peak_requested_bytes = 0;
  uint64_t peak_time_ns = 0;
  uint64_t total_allocs = 0;
  uint64_t total_frees = 0;
  uint64_t failed_allocs = 0;
};

class MemoryCounters {
 public:
  void on_alloc(uint64_t bytes, uint64_t requested) {
    const uint64_t live = live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const uint64_t req = requested_bytes_.fetch_add(requested, std::memory_order_relaxed) + requested;
    total_allocs_.fetch_add(1, std::memory_order_relaxed);
    raise(peak_requested_bytes_, req);
    // Coarse: a growing program raises the peak on every allocation, and the report gives its
    // time in seconds.
    if (raise(peak_bytes_, live)) peak_time_ns_.store(coarse_now_ns(), std::memory_order_relaxed);
  }
  void on_free(uint64_t bytes, uint64_t requested) {
    live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    requested_bytes_.fetch_sub(requested, std::memory_order_relaxed);
    total_frees_.fetch_add(1, std::memory_order_relaxed);
  }
  void on_failed() { failed_allocs_.fetch_add(1, std::memory_order_relaxed); }

  uint64_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }

  CounterSnapshot snapshot() const {
    CounterSnapshot s;
    s.live_bytes = live_bytes_.load(std::memory_order_relaxed);
    s.requested_bytes = requested_bytes_.load(std::memory_order_relaxed);
    s.peak_bytes = peak_bytes_.load(std::memory_order_relaxed);
    s.peak_requested_bytes = peak_requested_bytes_.load(std::memory_order_relaxed);
    s.peak_time_ns = peak_time_ns_.load(std::memory_order_relaxed);
    // Frees first: every free follows its allocation, so the count read after cannot be smaller.
    s.total_frees = total_frees_.load(std::memory_order_relaxed);
    s.total_allocs = total_allocs_.load(std::memory_order_relaxed);
    s.live_count = s.total_allocs >= s.total_frees ? s.total_allocs - s.total_frees : 0;
    s.failed_allocs = failed_allocs_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // Returns true if `value` became the new maximum.
  static bool raise(std::atomic<uint64_t>& max, uint64_t value) {
    uint64_t cur = max.load(std::memory_order_relaxed);
    while (value > cur)
      if (max.compare_exchange_weak(cur, value, std::memory_order_relaxed)) return true;
    return false;
  }

  std::atomic<uint64_t> live_bytes_{0};
  std::atomic<uint64_t> requested_bytes_{0};
  std::atomic<uint64_t> peak_bytes_{0};
  std::atomic<uint64_t> peak_requested_bytes_{0};
  std::atomic<uint64_t> peak_time_ns_{0};
  std::atomic<uint64_t> total_allocs_{0};
  std::atomic<uint64_t> total_frees_{0};
  std::atomic<uint64_t> failed_allocs_{0};
};

}  // namespace gpushim
