#include <gtest/gtest.h>

#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "accounting/allocation_tracker.h"
#include "accounting/memory_counters.h"
#include "accounting/time_series.h"

namespace gpushim {
namespace {

AllocationRecord rec(uint64_t size, StackId stack, int16_t device = 0, MemoryKind kind = MemoryKind::kDevice) {
  AllocationRecord r;
  r.size = size;
  r.requested = size - size / 8;
  r.stack = stack;
  r.device = device;
  r.kind = kind;
  return r;
}

TEST(MemoryCounters, TracksLivePeakAndTotals) {
  MemoryCounters c;
  c.on_alloc(100, 90);
  c.on_alloc(50, 50);
  c.on_free(100, 90);
  c.on_alloc(10, 10);
  c.on_failed();
  const CounterSnapshot s = c.snapshot();
  EXPECT_EQ(s.live_bytes, 60u);
  EXPECT_EQ(s.live_count, 2u);
  EXPECT_EQ(s.requested_bytes, 60u);
  EXPECT_EQ(s.peak_bytes, 150u);
  EXPECT_EQ(s.peak_requested_bytes, 140u);
  EXPECT_GT(s.peak_time_ns, 0u);
  EXPECT_EQ(s.total_allocs, 3u);
  EXPECT_EQ(s.total_frees, 1u);
  EXPECT_EQ(s.failed_allocs, 1u);
}

// CUDA's UsedMemHigh (PyTorch's max_memory_allocated under its async backend): reset to the live
// figure, then raised by both update paths; the report's peak is never reset.
TEST(MemoryCounters, TheWindowPeakResetsToTheLiveBytesAndThePeakNever) {
  MemoryCounters c;
  c.on_alloc(300, 300);
  c.on_alloc_locked(200, 200);
  c.on_free(400, 400);
  EXPECT_EQ(c.window_peak_bytes(), 500u);
  c.reset_window_peak();
  EXPECT_EQ(c.window_peak_bytes(), 100u);
  c.on_alloc_locked(50, 50);
  EXPECT_EQ(c.window_peak_bytes(), 150u);
  c.on_alloc(100, 100);
  EXPECT_EQ(c.window_peak_bytes(), 250u);
  EXPECT_EQ(c.snapshot().peak_bytes, 500u);
}

TEST(MemoryCounters, ExactUnderConcurrency) {
  MemoryCounters c;
  constexpr int kThreads = 8, kIters = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        c.on_alloc(t + 1, t + 1);
        if (i % 2) c.on_free(t + 1, t + 1);
      }
    });
  for (auto& t : ts) t.join();
  const CounterSnapshot s = c.snapshot();
  uint64_t expected = 0;
  for (int t = 0; t < kThreads; ++t) expected += static_cast<uint64_t>(t + 1) * (kIters / 2);
  EXPECT_EQ(s.live_bytes, expected);
  EXPECT_EQ(s.live_count, static_cast<uint64_t>(kThreads) * kIters / 2);
  EXPECT_EQ(s.total_allocs, static_cast<uint64_t>(kThreads) * kIters);
  EXPECT_GE(s.peak_bytes, expected);
}

TEST(AllocationTracker, InsertFindEraseAndDuplicates) {
  AllocationTracker t;
  EXPECT_TRUE(t.insert(0x1000, rec(512, 7)));
  EXPECT_FALSE(t.insert(0x1000, rec(64, 8))) << "a live pointer cannot be recorded twice";
  AllocationRecord out;
  ASSERT_TRUE(t.find(0x1000, &out));
  EXPECT_EQ(out.size, 512u);
  EXPECT_EQ(out.stack, 7u);
  EXPECT_TRUE(t.erase(0x1000, &out));
  EXPECT_FALSE(t.erase(0x1000, &out)) << "double free";
  EXPECT_FALSE(t.find(0x1000, &out));
  EXPECT_EQ(t.live_count(), 0u);
}

TEST(AllocationTracker, SitesAggregatePerStackDeviceAndKind) {
  AllocationTracker t;
  t.insert(0x1000, rec(100, 1));
  t.insert(0x2000, rec(200, 1));
  t.insert(0x3000, rec(300, 1, 1));                       // same stack, other device
  t.insert(0x4000, rec(400, 1, 0, MemoryKind::kManaged));  // same stack, other kind
  t.insert(0x5000, rec(500, 2));
  t.erase(0x2000, nullptr);
  std::map<std::tuple<StackId, int, int>, SiteTotals> by;
  for (const auto& [k, v] : t.sites()) by[{k.stack, k.device, static_cast<int>(k.kind)}] = v;
  ASSERT_EQ(by.size(), 4u);
  EXPECT_EQ((by[{1, 0, 0}].bytes), 100u);
  EXPECT_EQ((by[{1, 0, 0}].count), 1u);
  EXPECT_EQ((by[{1, 1, 0}].bytes), 300u);
  EXPECT_EQ((by[{1, 0, 1}].bytes), 400u);
  EXPECT_EQ((by[{2, 0, 0}].bytes), 500u);
  t.erase(0x5000, nullptr);
  for (const auto& [k, v] : t.sites()) EXPECT_NE(k.stack, 2u) << "a site with nothing live is dropped";
}

TEST(AllocationTracker, ConcurrentThreadsKeepExactSites) {
  AllocationTracker t;
  constexpr int kThreads = 8, kPerThread = 5000;
  std::vector<std::thread> ts;
  for (int th = 0; th < kThreads; ++th)
    ts.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        const uintptr_t p = (static_cast<uintptr_t>(th) << 32) | (static_cast<uintptr_t>(i) << 9);
        ASSERT_TRUE(t.insert(p, rec(1024, static_cast<StackId>(i % 3 + 1))));
        if (i % 4 == 0) {
          ASSERT_TRUE(t.erase(p, nullptr));
        }
      }
    });
  for (auto& x : ts) x.join();
  uint64_t bytes = 0, count = 0;
  for (const auto& [k, v] : t.sites()) bytes += v.bytes, count += v.count;
  EXPECT_EQ(count, static_cast<uint64_t>(kThreads) * kPerThread * 3 / 4);
  EXPECT_EQ(bytes, count * 1024);
  EXPECT_EQ(t.live().size(), count);
}

TEST(TimeSeries, SamplesAtMostEveryIntervalAndStaysBounded) {
  TimeSeries ts(/*interval_ns=*/10, /*max_samples=*/8);
  uint64_t appended = 0;
  for (uint64_t now = 0; now < 1000; ++now)
    ts.maybe_sample(now, [&](auto&& append) {
      append(Sample{now, 0, now, now * 2});
      ++appended;
    });
  const auto s = ts.samples();
  EXPECT_LT(s.size(), 8u);
  EXPECT_GT(appended, 8u) << "kept sampling after thinning";
  // Thinning keeps the whole run covered, oldest first, at an even spacing.
  for (size_t i = 1; i < s.size(); ++i) EXPECT_LT(s[i - 1].t_ns, s[i].t_ns);
  EXPECT_GT(s.back().t_ns, 500u);
  EXPECT_GT(ts.interval_ns(), 10u);
}

}  // namespace
}  // namespace gpushim
