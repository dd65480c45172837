// heaptrack's "temporary allocations" ranking over a trace: freed within the window, or (when the
// trace has iteration marks) in the iteration that made them, the first one included.
#include <gtest/gtest.h>

#include "summary_views.h"
#include "test_sizes.h"

namespace gpushim::analysis {
namespace {

constexpr uint64_t kMs = 1000 * 1000;

trace::TraceEvent ranked_event(trace::EventKind kind, uint64_t t_ns, uint64_t addr) {
  trace::TraceEvent e;
  e.kind = kind;
  e.t_ns = t_ns;
  e.addr = addr;
  e.size = e.requested = 1 * MiB;
  e.stack = 3;
  return e;
}

uint64_t temporaries(const AllocationRankings& r) {
  uint64_t n = 0;
  for (const AllocationRank& s : r.sites) n += s.temporary;
  return n;
}

TEST(TemporaryAllocations, TheFirstIterationCountsByIterationLikeTheOthers) {
  using trace::EventKind;
  TraceData t;
  t.devices = {trace::DeviceInfo{0, 16 * GiB, 0}};
  // Each iteration holds its block 50 ms (longer than the 10 ms window); the first one, before any
  // mark, was judged by the window alone and lost its temporary.
  t.events = {ranked_event(EventKind::kAlloc, 0, 0x1000),          ranked_event(EventKind::kFree, 50 * kMs, 0x1000),
              ranked_event(EventKind::kIteration, 51 * kMs, 0),    ranked_event(EventKind::kAlloc, 60 * kMs, 0x1000),
              ranked_event(EventKind::kFree, 110 * kMs, 0x1000),   ranked_event(EventKind::kIteration, 111 * kMs, 0),
              ranked_event(EventKind::kAlloc, 120 * kMs, 0x2000)};  // kept: never temporary
  const AllocationRankings r = rank_allocations(t, 10);
  EXPECT_TRUE(r.by_iteration);
  ASSERT_EQ(r.sites.size(), 1u);
  EXPECT_EQ(r.sites[0].allocs, 3u);
  EXPECT_EQ(temporaries(r), 2u);

  // A block freed after the mark that follows its allocation, later than the window: not temporary.
  t.events[1].t_ns = 52 * kMs;
  std::swap(t.events[1], t.events[2]);
  EXPECT_EQ(temporaries(rank_allocations(t, 10)), 1u);
}

TEST(TemporaryAllocations, WithoutMarksOnlyTheWindowCounts) {
  using trace::EventKind;
  TraceData t;
  t.devices = {trace::DeviceInfo{0, 16 * GiB, 0}};
  t.events = {ranked_event(EventKind::kAlloc, 0, 0x1000), ranked_event(EventKind::kFree, 9 * kMs, 0x1000),
              ranked_event(EventKind::kAlloc, 20 * kMs, 0x1000), ranked_event(EventKind::kFree, 40 * kMs, 0x1000)};
  const AllocationRankings r = rank_allocations(t, 10);
  EXPECT_FALSE(r.by_iteration);
  EXPECT_EQ(temporaries(r), 1u);
  EXPECT_EQ(temporaries(rank_allocations(t, 25)), 2u);
}

}  // namespace
}  // namespace gpushim::analysis
