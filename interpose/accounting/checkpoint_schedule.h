// When the per-site history takes a point on logical time, so that growth is judged the same for
// a 0.1 s run and a 10 h run of the same program: every `stride` events, where the stride doubles
// each time `per_stride` points were taken at it. A run of N events gets about
// per_stride * log2(N / per_stride) points, spread over the whole run; the first events are all
// points. Events are allocation calls and frees (one schedule) or iterations (another).
#pragma once

#include <atomic>
#include <cstdint>

namespace gpushim {

class CheckpointSchedule {
 public:
  explicit CheckpointSchedule(uint64_t per_stride = 16) : per_stride_(per_stride) {}

  // One more event: true when a point is due. A relaxed load and store, not an atomic add: the
  // add's lock prefix cost about 5 ns of every allocation and every free on the 4 KiB pair
  // (110 -> 100 ns, docs/benchmarks.md), a tenth of the pair. Threads counting at the same
  // moment can lose an increment, so a multi-threaded program's points come a few events later;
  // which thread takes a due point is still decided by due()'s compare-exchange, once.
  bool on_event() {
    const uint64_t n = count_.load(std::memory_order_relaxed) + 1;
    count_.store(n, std::memory_order_relaxed);
    return due(n);
  }
  // The event counter is kept elsewhere (the iteration count): true when `n` reached a point.
  bool due(uint64_t n) {
    uint64_t next = next_.load(std::memory_order_relaxed);
    if (n < next) return false;
    const uint64_t stride = stride_.load(std::memory_order_relaxed);
    if (!next_.compare_exchange_strong(next, n + stride, std::memory_order_relaxed)) return false;
    if (taken_.fetch_add(1, std::memory_order_relaxed) + 1 == per_stride_ * (log_stride(stride) + 1))
      stride_.store(stride * 2, std::memory_order_relaxed);
    return true;
  }

 private:
  static uint64_t log_stride(uint64_t s) {
    uint64_t l = 0;
    while (s > 1) s >>= 1, ++l;
    return l;
  }
  const uint64_t per_stride_;
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> next_{1};
  std::atomic<uint64_t> stride_{1};
  std::atomic<uint64_t> taken_{0};
};

}  // namespace gpushim
