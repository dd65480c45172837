// Per-operation latency for Google Benchmark loops: p50/p99 need every sample, not the mean that
// Google Benchmark reports. Each benchmark thread writes only its own slot during the timed loop;
// after the loop (Google Benchmark's stop barrier has run in every thread) thread 0 merges the
// slots and publishes the percentiles as counters.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace gpushim_bench {

using Clock = std::chrono::steady_clock;

inline uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

// Median cost of reading the clock twice back to back, subtracted from every sample so that a
// 60 ns operation is not reported as 80 ns. Measured once per process.
inline uint64_t timer_overhead_ns() {
  static const uint64_t overhead = [] {
    std::vector<uint64_t> v(20001);
    for (auto& x : v) {
      const auto a = Clock::now();
      const auto b = Clock::now();
      x = ns_between(a, b);
    }
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2];
  }();
  return overhead;
}

class LatencySamples {
 public:
  static constexpr int kMaxThreads = 16;

  // Called by every thread before its loop: clears and sizes the thread's own slot.
  void begin(const benchmark::State& state, size_t samples_per_iteration = 1) {
    auto& mine = slots_[static_cast<size_t>(state.thread_index())];
    mine.clear();
    mine.reserve(static_cast<size_t>(state.max_iterations) * samples_per_iteration);
  }

  void add(const benchmark::State& state, uint64_t ns) {
    const uint64_t o = timer_overhead_ns();
    slots_[static_cast<size_t>(state.thread_index())].push_back(ns > o ? ns - o : 0);
  }

  // Called by every thread after its loop; thread 0 publishes p50/p99/mean over all threads.
  // Counters are summed over threads by Google Benchmark, so only thread 0 sets them.
  void publish(benchmark::State& state) {
    if (state.thread_index() != 0) return;
    std::vector<uint64_t> all;
    for (int t = 0; t < state.threads(); ++t) {
      auto& s = slots_[static_cast<size_t>(t)];
      all.insert(all.end(), s.begin(), s.end());
    }
    if (all.empty()) return;
    double sum = 0;
    for (uint64_t v : all) sum += static_cast<double>(v);
    state.counters["mean_ns"] = sum / static_cast<double>(all.size());
    state.counters["p50_ns"] = static_cast<double>(percentile(all, 0.50));
    state.counters["p99_ns"] = static_cast<double>(percentile(all, 0.99));
    state.counters["samples"] = static_cast<double>(all.size());
    state.counters["timer_overhead_ns"] = static_cast<double>(timer_overhead_ns());
  }

 private:
  static uint64_t percentile(std::vector<uint64_t>& v, double q) {
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return v[k];
  }

  std::array<std::vector<uint64_t>, kMaxThreads> slots_;
};

}  // namespace gpushim_bench
