// Exact, lock-free counters for one kind of memory on one device.
//
// Updated on every allocation and free from any thread; exact because every update is one atomic
// read-modify-write, and the peak is raised with a CAS loop right after the live total moves.
// Or, for a device whose pool keeps the records, every writer holds the pool's lock and the
// pooled path uses the *_locked variants (plain loads and stores; readers still need no lock).
// The live count is allocations minus frees rather than a counter of its own: one atomic
// read-modify-write less each way on the hot path.
#pragma once

#include <atomic>
#include <cstdint>

#include "accounting/memory_figures.h"
#include "util/clock.h"

namespace gpushim {

// Adds `delta` to a counter that only writers holding one common lock change: a plain load and
// store, no lock-prefixed read-modify-write; readers without the lock still see whole values.
// Returns the new value.
inline uint64_t add_under_lock(std::atomic<uint64_t>& v, uint64_t delta) {
  const uint64_t now = v.load(std::memory_order_relaxed) + delta;
  v.store(now, std::memory_order_relaxed);
  return now;
}

// The five figures (accounting/memory_figures.h) and what only a device's counters keep.
struct CounterSnapshot : MemoryFigures {
  uint64_t requested_bytes = 0;
  uint64_t peak_requested_bytes = 0;
  uint64_t peak_time_ns = 0;
  uint64_t failed_allocs = 0;
};

class MemoryCounters {
 public:
  void on_alloc(uint64_t bytes, uint64_t requested) {
    const uint64_t live = live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const uint64_t req = requested_bytes_.fetch_add(requested, std::memory_order_relaxed) + requested;
    total_allocs_.fetch_add(1, std::memory_order_relaxed);
    raise(peak_requested_bytes_, req);
    // The clock the trace stamps its events with (not the coarse one, 4 ms steps): the report and
    // the trace of one run name the same moment for the peak. Read only when the peak rises.
    if (raise(peak_bytes_, live)) peak_time_ns_.store(now_ns(), std::memory_order_relaxed);
    raise(window_peak_bytes_, live);
  }
  void on_free(uint64_t bytes, uint64_t requested) {
    live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    requested_bytes_.fetch_sub(requested, std::memory_order_relaxed);
    total_frees_.fetch_add(1, std::memory_order_relaxed);
  }
  // The same under a lock that every writer of these counters holds (a pool's, for a device whose
  // pool keeps the records: see DeviceLedger::locked): plain loads and stores, no lock-prefixed
  // read-modify-writes; still atomics, so that readers need no lock. on_failed is not covered: it
  // stays a read-modify-write, written without the lock.
  void on_alloc_locked(uint64_t bytes, uint64_t requested) {
    const uint64_t live = add_under_lock(live_bytes_, bytes);
    const uint64_t req = add_under_lock(requested_bytes_, requested);
    add_under_lock(total_allocs_, 1);
    if (req > peak_requested_bytes_.load(std::memory_order_relaxed))
      peak_requested_bytes_.store(req, std::memory_order_relaxed);
    if (live > peak_bytes_.load(std::memory_order_relaxed)) {
      peak_bytes_.store(live, std::memory_order_relaxed);
      peak_time_ns_.store(now_ns(), std::memory_order_relaxed);
    }
    if (live > window_peak_bytes_.load(std::memory_order_relaxed)) window_peak_bytes_.store(live, std::memory_order_relaxed);
  }
  void on_free_locked(uint64_t bytes, uint64_t requested) {
    add_under_lock(live_bytes_, 0 - bytes);
    add_under_lock(requested_bytes_, 0 - requested);
    add_under_lock(total_frees_, 1);
  }
  void on_failed() { failed_allocs_.fetch_add(1, std::memory_order_relaxed); }

  uint64_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }
  // The most live bytes since the last reset_window_peak (or ever): what CUDA's memory pools call
  // UsedMemHigh, which a program may reset; the report's peak is never reset.
  uint64_t window_peak_bytes() const { return window_peak_bytes_.load(std::memory_order_relaxed); }
  // The window then starts at the live total. An allocation racing with the reset may leave the
  // peak at the total from just before it, never below the live total.
  void reset_window_peak() {
    window_peak_bytes_.store(live_bytes(), std::memory_order_relaxed);
    raise(window_peak_bytes_, live_bytes());
  }

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
  std::atomic<uint64_t> window_peak_bytes_{0};
  std::atomic<uint64_t> total_allocs_{0};
  std::atomic<uint64_t> total_frees_{0};
  std::atomic<uint64_t> failed_allocs_{0};
};

}  // namespace gpushim
