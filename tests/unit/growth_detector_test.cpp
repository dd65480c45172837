#include "accounting/growth_detector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "accounting/site_history.h"
#include "test_sizes.h"

namespace gpushim {
namespace {


// n points 100 ms apart; bytes(i) and iteration(i) given.
std::vector<SitePoint> series(size_t n, const std::function<uint64_t(size_t)>& bytes,
                              const std::function<uint64_t(size_t)>& iteration = [](size_t) { return 0; }) {
  std::vector<SitePoint> p;
  for (size_t i = 0; i < n; ++i) p.push_back(SitePoint{i * 100000000ull, bytes(i), bytes(i) / MiB, iteration(i)});
  return p;
}

std::vector<GrowthFinding> detect(std::vector<std::vector<SitePoint>> s) { return detect_growth(s); }

TEST(GrowthDetector, SteadyLeakIsASuspectWithExactRates) {
  // One MiB per iteration, one iteration every two samples (200 ms).
  const auto f = detect({series(40, [](size_t i) { return (i / 2 + 1) * MiB; }, [](size_t i) { return i / 2; })});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].baseline_bytes, 1 * MiB);
  EXPECT_EQ(f[0].growth_bytes, 19 * MiB);
  EXPECT_EQ(f[0].live_bytes, 20 * MiB);
  EXPECT_EQ(f[0].live_count, 20u);
  EXPECT_NEAR(f[0].bytes_per_s, 5.0 * MiB, 0.01 * MiB);
  ASSERT_TRUE(f[0].has_iterations);
  EXPECT_NEAR(f[0].bytes_per_iteration, 1.0 * MiB, 1e-6 * MiB);
  EXPECT_EQ(f[0].iterations, 19u);
  EXPECT_GT(f[0].trend, 0.9);
  EXPECT_EQ(f[0].samples, 40u);
}

TEST(GrowthDetector, TheRatePerIterationIsExactWhereCheckpointsFallInsideIterations) {
  // A step allocates scratch, then the leak (128 KiB), then frees the scratch: a checkpoint at each
  // call, the iteration counted as the step begins. Per step the leaking site is seen at k-1, k, k.
  std::vector<SitePoint> p;
  uint64_t t = 0;
  for (uint64_t k = 1; k <= 12; ++k)
    for (uint64_t held : {k - 1, k, k})
      if (held != 0) p.push_back(SitePoint{++t * 1000000, held * 128 * KiB, held, k});
  const auto f = detect({p});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_DOUBLE_EQ(f[0].bytes_per_iteration, 128.0 * KiB);  // least squares over every point: 126.6 KiB
}

TEST(GrowthDetector, PointsTheIterationCountTriggeredMakeTheRateExact) {
  // A program leaking exactly 1 MiB per step, marked at the step's end, with checkpoints of the
  // event schedule falling before and after the leaking call at irregular places (a thinning
  // schedule): each iteration's last point is sometimes before the leak, sometimes after. The
  // slope over those read 987.6 KiB; the points taken at the marks are at one place in every
  // iteration, and give 1 MiB.
  std::vector<SitePoint> p;
  uint64_t t = 0;
  auto point = [&](uint64_t held, uint64_t iteration, bool at_mark) {
    SitePoint q{++t * 1000000, held * MiB, held, iteration};
    q.at_iteration = at_mark ? IterationPoint::kMark : IterationPoint::kNone;
    p.push_back(q);
  };
  for (uint64_t k = 0; k < 24; ++k) {
    // Step k+1 runs with k marks counted: the leak makes it k+1 MiB held.
    if (k % 3 == 0) point(k, k, false);        // before the leaking call
    if (k % 5 != 1) point(k + 1, k, false);    // after it
    if (k % 2 == 0 || k < 4) point(k + 1, k + 1, true);  // the mark ending the step (thinned later on)
  }
  const auto f = detect({p});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_DOUBLE_EQ(f[0].bytes_per_iteration, 1.0 * MiB);
  // Without the flag (a trace of format 1.6), each iteration's last point as before: not exact here.
  for (SitePoint& q : p) q.at_iteration = IterationPoint::kNone;
  const auto old = detect({p});
  ASSERT_EQ(old.size(), 1u);
  EXPECT_NE(old[0].bytes_per_iteration, 1.0 * MiB);
}

TEST(GrowthDetector, WithoutIterationMarksOnlyTheTimeRate) {
  const auto f = detect({series(20, [](size_t i) { return (i + 1) * MiB; })});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].has_iterations);
  EXPECT_NEAR(f[0].bytes_per_s, 10.0 * MiB, 0.01 * MiB);
}

TEST(GrowthDetector, LargeFlatSitesAreNotSuspects) {
  // Model weights: allocated at once, or in a few steps at the start, then flat forever.
  EXPECT_TRUE(detect({series(50, [](size_t) { return 1024 * MiB; })}).empty());
  EXPECT_TRUE(detect({series(50, [](size_t i) { return (i < 1 ? 256 : 1024) * MiB; })}).empty());
  EXPECT_TRUE(detect({series(50, [](size_t i) { return std::min<size_t>(i + 1, 3) * 256 * MiB; })}).empty());
}

TEST(GrowthDetector, WarmUpThatStopsGrowingIsNotASuspect) {
  // Grows for the first half (caches filling), flat for the rest.
  EXPECT_TRUE(detect({series(60, [](size_t i) { return std::min<size_t>(i, 30) * MiB + MiB; })}).empty());
}

TEST(GrowthDetector, MemoryThatReturnsToBaselineIsNotASuspect) {
  // A sawtooth: grows for 10 samples, released, again.
  EXPECT_TRUE(detect({series(60, [](size_t i) { return (i % 10 + 1) * MiB; })}).empty());
  // Grows all run long but dips back to the start once.
  EXPECT_TRUE(detect({series(60, [](size_t i) { return i == 40 ? MiB : (i + 1) * MiB; })}).empty());
}

TEST(GrowthDetector, NoisyUpwardDriftIsASuspect) {
  // Two allocations and one free per iteration: live memory zig-zags but never comes back.
  const auto f = detect({series(64, [](size_t i) { return (i / 2 + (i % 2 ? 2 : 0) + 1) * MiB; })});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_GT(f[0].trend, 0.5);
}

TEST(GrowthDetector, SlowLeakSeenAsAStaircaseIsASuspect) {
  // One leaked MiB every 8 samples: mostly flat steps, but always up.
  EXPECT_EQ(detect({series(64, [](size_t i) { return (i / 8 + 1) * MiB; })}).size(), 1u);
}

TEST(GrowthDetector, LeakStartingMidRunIsASuspect) {
  EXPECT_EQ(detect({series(64, [](size_t i) { return (i < 32 ? 1 : i - 30) * MiB; })}).size(), 1u);
}

TEST(GrowthDetector, TooFewSamplesOrShrinkingIsNot) {
  EXPECT_TRUE(detect({series(7, [](size_t i) { return (i + 1) * MiB; })}).empty());
  EXPECT_TRUE(detect({series(40, [](size_t i) { return (41 - i) * MiB; })}).empty());
  EXPECT_TRUE(detect({{}}).empty());
}

TEST(GrowthDetector, RanksLargestGrowthFirstAndKeepsSeriesIndices) {
  const auto f = detect({series(30, [](size_t) { return 512 * MiB; }),           // flat weights
                         series(30, [](size_t i) { return (i + 1) * MiB; }),      // +29 MiB
                         series(30, [](size_t i) { return (2 * i + 1) * MiB; })});  // +58 MiB
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].series, 2u);
  EXPECT_EQ(f[1].series, 1u);
}

SiteKey key(uint32_t stack) { return SiteKey{stack, 0, MemoryKind::kDevice}; }

TEST(SiteHistory, BoundedSeriesSpanTheWholeLifeOfASite) {
  SiteHistory h(/*max_sites=*/16, /*max_points=*/8);
  for (uint64_t t = 0; t < 100; ++t) h.sample(t, t / 10, {{key(1), SiteTotals{(t + 1) * MiB, t + 1}}});
  EXPECT_EQ(h.samples(), 100u);
  const auto s = h.series();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_LE(s[0].points.size(), 8u + 1);  // the kept points, and the latest instant
  EXPECT_GE(s[0].points.size(), 4u);
  EXPECT_EQ(s[0].points.front().t_ns, 0u);
  EXPECT_EQ(s[0].points.back().t_ns, 99u);  // thinned evenly, and ending now
  for (size_t i = 1; i < s[0].points.size(); ++i) EXPECT_GT(s[0].points[i].t_ns, s[0].points[i - 1].t_ns);
  EXPECT_EQ(s[0].points.back().bytes, (s[0].points.back().t_ns + 1) * MiB);
  EXPECT_EQ(s[0].points.back().iteration, s[0].points.back().t_ns / 10);
}

TEST(SiteHistory, SitesWithNothingLiveLoseTheirHistory) {
  SiteHistory h;
  h.sample(1, 0, {{key(1), SiteTotals{MiB, 1}}, {key(2), SiteTotals{MiB, 1}}});
  h.sample(2, 0, {{key(2), SiteTotals{2 * MiB, 2}}});
  auto s = h.series();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].key.stack, 2u);
  EXPECT_EQ(s[0].points.size(), 2u);
  h.sample(3, 0, {{key(1), SiteTotals{MiB, 1}}});  // site 1 again: a fresh history
  s = h.series();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].points.size(), 1u);
}

TEST(SiteHistory, KeepsTheLargestSitesWhenThereAreTooMany) {
  SiteHistory h(/*max_sites=*/2, /*max_points=*/8);
  h.sample(1, 0, {{key(1), SiteTotals{1, 1}}, {key(2), SiteTotals{300, 1}}, {key(3), SiteTotals{200, 1}}});
  auto s = h.series();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NE(s[0].key.stack, 1u);
  EXPECT_NE(s[1].key.stack, 1u);
  EXPECT_GT(h.memory_bytes(), 0u);
}

}  // namespace
}  // namespace gpushim
