// A single-producer single-consumer ring of trace events: the allocating thread pushes, the writer
// thread drains. Fixed capacity, so memory stays bounded however slow the disk is; when full, the
// producer drops the event and counts it (the recorder turns the count into a kDropped marker).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "trace/trace_event.h"

namespace gpushim::trace {

class EventRing {
 public:
  explicit EventRing(size_t capacity_pow2) : slots_(new TraceEvent[capacity_pow2]), mask_(capacity_pow2 - 1) {}

  size_t capacity() const { return mask_ + 1; }

  // ---- producer (the owning thread) ----
  // Room for `n` more events? Re-reads the consumer's position only when the cached one says no.
  bool has_room(size_t n) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - cached_tail_ + n <= capacity()) return true;
    cached_tail_ = tail_.load(std::memory_order_acquire);
    return head - cached_tail_ + n <= capacity();
  }
  // Requires has_room(1). Returns the number of events in the ring after the push (as far as the
  // producer knows), so the caller can wake the consumer at thresholds.
  uint64_t push(const TraceEvent& e) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    slots_[head & mask_] = e;
    head_.store(head + 1, std::memory_order_release);
    // Events come hundreds of nanoseconds apart, with the program's own work in between: fetch the
    // next slot now, so the next push does not wait for memory.
    __builtin_prefetch(&slots_[(head + 1) & mask_], 1, 3);
    return head + 1 - cached_tail_;
  }

  // ---- consumer (the writer thread) ----
  // Calls `f(const TraceEvent&)` for every event pushed so far, then frees their slots.
  template <typename F>
  size_t drain(F&& f) {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    const uint64_t head = head_.load(std::memory_order_acquire);
    for (uint64_t i = tail; i != head; ++i) f(slots_[i & mask_]);
    tail_.store(head, std::memory_order_release);
    return static_cast<size_t>(head - tail);
  }
  // Only when no producer uses the ring any more (its thread exited, and it was drained).
  void reset() {
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
    cached_tail_ = 0;
  }

 private:
  std::unique_ptr<TraceEvent[]> slots_;
  const size_t mask_;
  alignas(64) std::atomic<uint64_t> head_{0};
  uint64_t cached_tail_ = 0;  // producer's last view of tail_
  alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace gpushim::trace
