// The one growth definition (judge_growth) over site series: stacks that symbolize alike are one
// site before they are judged.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "report/growth_verdict.h"
#include "test_sizes.h"
#include "test_frames.h"

namespace gpushim {
namespace {


// A leaking step: one more MiB at each of `n` checkpoints (one per iteration).
SiteSeries growing(StackId stack, int n, uint64_t first_t = 1) {
  SiteSeries s{SiteKey{stack, 0, MemoryKind::kDevice}, {}};
  for (int i = 0; i < n; ++i) {
    const uint64_t k = static_cast<uint64_t>(i) + 1;
    s.points.push_back(SitePoint{(first_t + static_cast<uint64_t>(i)) * 1000, k * MiB, k, k});
  }
  return s;
}

// A flat holder of `count` MiB allocations from checkpoint `first_t` on.
SiteSeries flat(StackId stack, uint64_t count, uint64_t first_t, uint64_t last_t) {
  SiteSeries s{SiteKey{stack, 0, MemoryKind::kDevice}, {}};
  for (uint64_t t = first_t; t <= last_t; ++t) s.points.push_back(SitePoint{t * 1000, count * MiB, count, t});
  return s;
}

GrowthEvidence counted(uint64_t iterations) {
  GrowthEvidence e;
  e.samples = iterations;
  e.iterations = iterations;
  e.iteration_sources = 1;
  return e;
}

// Checkpoints only (no iteration counted, no loop found): `n` checkpoints at each of which the
// site holds one more MiB, and the process has made `per_point` allocations more (`allocs_known`
// false: points that do not say).
GrowthReport judged_without_iterations(int n, uint64_t per_point, bool allocs_known = true, bool through_torch = false) {
  SiteSeries s{SiteKey{5, 0, MemoryKind::kDevice}, {}};
  for (int i = 0; i < n; ++i) {
    const uint64_t k = static_cast<uint64_t>(i) + 1;
    s.points.push_back(SitePoint{k * 1000, k * MiB, k, 0, k, allocs_known ? k * per_point : 0});
  }
  GrowthEvidence e;
  e.samples = static_cast<uint64_t>(n);
  return judge_growth({s}, e, [&](const SiteKey&) {
    std::vector<FrameInfo> f;
    if (through_torch)
      f.push_back(native_frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                               "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so"));
    f.push_back(python_frame("f", "x.py", 1));
    return f;
  });
}

TEST(GrowthVerdict, WithoutIterationsASiteFilledWhileNothingElseAllocatedIsNoSuspect) {
  // Weights loaded one by one, and the run ended there (out of memory during the load): every
  // allocation of the process went to the site. A load, not a leak.
  const GrowthReport load = judged_without_iterations(10, 1);
  EXPECT_EQ(load.verdict, "none");
  EXPECT_TRUE(load.suspects.empty());
  EXPECT_NE(load.evidence.find("1 site that grew only while the program allocated nothing else"), std::string::npos)
      << load.evidence;
  // The same rise beside other allocations (a step's scratch memory) is a suspect.
  const GrowthReport leak = judged_without_iterations(10, 3);
  EXPECT_EQ(leak.verdict, "suspects");
  ASSERT_EQ(leak.suspects.size(), 1u);
  EXPECT_EQ(leak.evidence.find("grew only while"), std::string::npos) << leak.evidence;
  // Points that do not know the allocations made cannot tell the two apart: judged as before.
  EXPECT_EQ(judged_without_iterations(10, 1, false).verdict, "suspects");
  // Nor can a site allocating through PyTorch's allocator: with its cache in charge, only the
  // cache's segments reach the shim, never the tensors between them.
  EXPECT_EQ(judged_without_iterations(10, 1, true, true).verdict, "suspects");
}

TEST(GrowthVerdict, WithoutIterationsALeakSeenAtEveryCallIsStillASuspect) {
  // Early checkpoints come at every call: a step's scratch allocation, its leak, its scratch's
  // free, each a point of its own. The leak's rise is then never beside another allocation at
  // the same checkpoint; between one rise and the next, the scratch was.
  SiteSeries s{SiteKey{5, 0, MemoryKind::kDevice}, {}};
  uint64_t t = 0, allocs = 0;
  for (uint64_t k = 1; k <= 6; ++k) {
    s.points.push_back(SitePoint{++t * 1000, (k - 1) * MiB, k - 1, 0, t, ++allocs});  // scratch
    s.points.push_back(SitePoint{++t * 1000, k * MiB, k, 0, t, ++allocs});            // the leak
    s.points.push_back(SitePoint{++t * 1000, k * MiB, k, 0, t, allocs});              // scratch freed
  }
  s.points.erase(s.points.begin());  // the site's series starts at its first allocation
  GrowthEvidence e;
  e.samples = s.points.size();
  const GrowthReport g = judge_growth({s}, e, [](const SiteKey&) { return std::vector<FrameInfo>{}; });
  EXPECT_EQ(g.verdict, "suspects") << g.evidence;
}

TEST(GrowthVerdict, CountedIterationsMakeASiteThatAloneAllocatesASuspect) {
  // A loop whose only allocation is the one it leaks: the program's own iteration count says it
  // is a loop, so the rise is growth per iteration, not a load.
  SiteSeries s = growing(5, 20);
  for (SitePoint& p : s.points) p.allocs = p.count;
  const GrowthReport g = judge_growth({s}, counted(20), [](const SiteKey&) { return std::vector<FrameInfo>{}; });
  EXPECT_EQ(g.verdict, "suspects");
}

TEST(GrowthVerdict, StacksThatSymbolizeAlikeAreOneSuspectWithTheSitesLiveFigures) {
  // Stack 7 is the leaking line reached through the interpreter's usual frames; stack 3 is the
  // same line reached, in the first calls, through other interpreter frames: it holds 2 of the
  // site's allocations and does not grow on its own. The suspect is the site: 62 allocations.
  std::vector<SiteSeries> series = {growing(7, 60, 3), flat(3, 2, 1, 62), flat(9, 4, 1, 62)};
  auto frames_of = [](const SiteKey& key) {
    std::vector<FrameInfo> f;
    if (key.stack == 9) {
      f.push_back(python_frame("load_model", "train.py", 12));
    } else {
      // Native frames differ in address but symbolize alike.
      f.push_back(native_frame("_PyEval_EvalFrameDefault", "", "ceval.c", 4000));
      f.push_back(python_frame("leaky_step", "train.py", 23));
    }
    return f;
  };
  const GrowthReport g = judge_growth(series, counted(62), frames_of);
  ASSERT_EQ(g.verdict, "suspects");
  ASSERT_EQ(g.suspects.size(), 1u);
  const GrowthSuspectReport& s = g.suspects[0];
  EXPECT_EQ(s.live_count, 62u);
  EXPECT_EQ(s.live_bytes, 62 * MiB);
  EXPECT_EQ(s.stack_id, 3u);  // the smallest member's, whichever side merges
  ASSERT_EQ(s.frames.size(), 2u);
  EXPECT_EQ(s.frames[1].function, "leaky_step");
  // The site's growth: from 2 MiB at the first checkpoint (the variant alone) to 62 MiB.
  EXPECT_EQ(s.growth_bytes, 60 * MiB);
}

TEST(GrowthVerdict, MergedOrderDoesNotDependOnTheHistorysOrder) {
  auto frames_of = [](const SiteKey&) { return std::vector<FrameInfo>{python_frame("leaky_step", "train.py", 23)}; };
  const GrowthReport a = judge_growth({growing(7, 40), flat(3, 1, 1, 40)}, counted(40), frames_of);
  const GrowthReport b = judge_growth({flat(3, 1, 1, 40), growing(7, 40)}, counted(40), frames_of);
  ASSERT_EQ(a.suspects.size(), 1u);
  ASSERT_EQ(b.suspects.size(), 1u);
  EXPECT_EQ(a.suspects[0].live_count, 41u);
  EXPECT_EQ(a.suspects[0].live_count, b.suspects[0].live_count);
  EXPECT_EQ(a.suspects[0].growth_bytes, b.suspects[0].growth_bytes);
  EXPECT_EQ(a.suspects[0].stack_id, b.suspects[0].stack_id);
}

TEST(GrowthVerdict, StacksOnDifferentLinesStayApart) {
  auto frames_of = [](const SiteKey& key) {
    return std::vector<FrameInfo>{python_frame("leaky_step", "train.py", key.stack == 7 ? 23 : 24)};
  };
  const GrowthReport g = judge_growth({growing(7, 30), growing(8, 30)}, counted(30), frames_of);
  ASSERT_EQ(g.suspects.size(), 2u);
  EXPECT_EQ(g.suspects[0].live_count, 30u);
  EXPECT_EQ(g.suspects[1].live_count, 30u);
}

TEST(GrowthVerdict, StacksOfOneSiteThinnedByTheHistoryStillSumExactly) {
  // Through the site history itself, which thins long series: the leaking line's usual stack
  // (17) starts at the first checkpoint, the variant (4) at the fifth, when 3 of the site's
  // allocations are its own from then on (the site holds i MiB at checkpoint i either way). The
  // two tracks differ in age, so in stride. Each checkpoint is one iteration; the leak is 1 MiB
  // per iteration.
  SiteHistory history(/*max_sites=*/16, /*max_points=*/8);
  const SiteKey usual{17, 0, MemoryKind::kDevice}, variant{4, 0, MemoryKind::kDevice};
  for (uint64_t i = 1; i <= 100; ++i) {
    std::vector<std::pair<SiteKey, SiteTotals>> sites;
    SiteTotals u;
    u.count = i >= 5 ? i - 3 : i;
    u.bytes = u.count * MiB;
    sites.emplace_back(usual, u);
    if (i >= 5) {
      SiteTotals v;
      v.bytes = 3 * MiB;
      v.count = 3;
      sites.emplace_back(variant, v);
    }
    ASSERT_TRUE(history.sample(i * 1000, i, sites));
  }
  std::vector<SiteSeries> series = history.series();
  ASSERT_EQ(series.size(), 2u);
  for (const SiteSeries& s : series) {
    ASSERT_LT(s.points.size(), 8u + 1);  // thinned (the last checkpoint may come on top)
    EXPECT_EQ(s.points.back().instant, 100u);
  }
  auto frames_of = [](const SiteKey&) { return std::vector<FrameInfo>{python_frame("leaky_step", "train.py", 23)}; };
  const GrowthReport g = judge_growth(series, counted(100), frames_of);
  ASSERT_EQ(g.suspects.size(), 1u);
  const GrowthSuspectReport& s = g.suspects[0];
  EXPECT_EQ(s.live_count, 100u);
  EXPECT_EQ(s.live_bytes, 100 * MiB);
  // Every checkpoint the sum uses is exact for both stacks: the slope is the leak's, exactly.
  EXPECT_DOUBLE_EQ(s.bytes_per_iteration, static_cast<double>(MiB));
}

TEST(GrowthVerdict, ACheckpointOneStackThinnedOutIsLeftOutOfTheSum) {
  // Stack 5 kept its first checkpoint, then only even ones; at odd ones its value is unknown, so
  // the site's sum keeps the first and the even ones (a stale value would bend the slope).
  SiteSeries coarse{SiteKey{5, 0, MemoryKind::kDevice}, {SitePoint{1000, 2 * MiB, 2, 1}}};
  SiteSeries fine = growing(6, 40);
  for (uint64_t t = 2; t <= 40; t += 2) coarse.points.push_back(SitePoint{t * 1000, 2 * MiB, 2, t});
  auto frames_of = [](const SiteKey&) { return std::vector<FrameInfo>{python_frame("leaky_step", "train.py", 23)}; };
  const GrowthReport g = judge_growth({coarse, fine}, counted(40), frames_of);
  ASSERT_EQ(g.suspects.size(), 1u);
  EXPECT_EQ(g.suspects[0].live_count, 42u);
  EXPECT_EQ(g.suspects[0].samples, 21u);  // t = 1, then every even checkpoint
  EXPECT_DOUBLE_EQ(g.suspects[0].bytes_per_iteration, static_cast<double>(MiB));
}

}  // namespace
}  // namespace gpushim
