// Allocated and reserved bytes over time, per device, for plots and growth detection.
//
// Samples are taken by whichever thread allocates or frees once the interval has passed (no
// sampler thread: a process that is idle has nothing new to sample). Memory stays bounded in
// long runs: when the buffer is full, every other sample is dropped and the interval doubles,
// so the series always covers the whole run at an even resolution.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace gpushim {

struct Sample {
  uint64_t t_ns;       // since the shim started
  int16_t device;
  uint64_t allocated;
  uint64_t reserved;
};

class TimeSeries {
 public:
  TimeSeries(uint64_t interval_ns, size_t max_samples) : interval_ns_(interval_ns), max_samples_(max_samples) {}

  // Cheap when not due: one relaxed load and a compare. `take` appends the samples of one
  // instant (one per device) through the callback it is given.
  template <typename Take>
  void maybe_sample(uint64_t now_ns, Take&& take) {
    uint64_t due = next_due_ns_.load(std::memory_order_relaxed);
    if (now_ns < due) return;
    const uint64_t interval = interval_ns_.load(std::memory_order_relaxed);
    if (!next_due_ns_.compare_exchange_strong(due, now_ns + interval, std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(mu_);
    take([&](const Sample& s) { samples_.push_back(s); });
    if (samples_.size() >= max_samples_) thin();
  }

  std::vector<Sample> samples() const {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }
  uint64_t interval_ns() const { return interval_ns_.load(std::memory_order_relaxed); }

  // fork(): a sample in progress holds the lock (and, under it, the tracker's and the site
  // history's); the child must not inherit it held.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 private:
  void thin() {
    // Keep every other instant (an instant may hold one sample per device).
    std::vector<Sample> kept;
    uint64_t last_t = UINT64_MAX;
    size_t instant = 0;
    for (const Sample& s : samples_) {
      if (s.t_ns != last_t) ++instant, last_t = s.t_ns;
      if (instant % 2 == 1) kept.push_back(s);
    }
    samples_.swap(kept);
    interval_ns_.store(interval_ns_.load(std::memory_order_relaxed) * 2, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> interval_ns_;
  const size_t max_samples_;
  std::atomic<uint64_t> next_due_ns_{0};
  mutable std::mutex mu_;
  std::vector<Sample> samples_;
};

}  // namespace gpushim
