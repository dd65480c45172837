// The replay's model of PyTorch's CUDA caching allocator (analysis/pytorch_policy.h): each rule
// it claims, checked on the simulated device, and its figures through replay_trace.
#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <vector>

#include "policy/sim_backend.h"
#include "pytorch_policy.h"
#include "replay.h"
#include "test_sizes.h"

namespace gpushim::analysis {
namespace {

using PT = PyTorchCachingAllocator;

CUstream pytorch_stream(uintptr_t s) { return reinterpret_cast<CUstream>(s); }

struct Got {
  uintptr_t p = 0;
  uint64_t size = 0;
};

Got alloc(PT& pt, uint64_t bytes, uintptr_t s = 0) {
  void* p = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(pt.allocate(AllocRequest{bytes, pytorch_stream(s), false}, &p, &size), CUDA_SUCCESS) << bytes;
  return Got{reinterpret_cast<uintptr_t>(p), size};
}

void release(PT& pt, Got g, uintptr_t s = 0) {
  EXPECT_EQ(pt.deallocate(reinterpret_cast<void*>(g.p), pytorch_stream(s), false), CUDA_SUCCESS);
}

TEST(PyTorchPolicy, RoundsTo512AndSizesSegmentsByPool) {
  EXPECT_EQ(PT::round_size(1), 512u);
  EXPECT_EQ(PT::round_size(512), 512u);
  EXPECT_EQ(PT::round_size(513), 1024u);
  EXPECT_EQ(PT::segment_size(PT::round_size(1)), 2 * kMiB);
  EXPECT_EQ(PT::segment_size(1 * kMiB), 2 * kMiB);            // the small pool's limit is inclusive
  EXPECT_EQ(PT::segment_size(1 * kMiB + 512), 20 * kMiB);     // 1-10 MiB: 20 MiB segments
  EXPECT_EQ(PT::segment_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(PT::segment_size(10 * kMiB), 10 * kMiB);          // from 10 MiB: rounded to 2 MiB
  EXPECT_EQ(PT::segment_size(10 * kMiB + 512), 12 * kMiB);
}

TEST(PyTorchPolicy, SmallRequestsAreCarvedFromOne2MiBSegment) {
  SimBackend sim(1ull << 40);
  PT pt(sim, false);
  const Got a = alloc(pt, 1000), b = alloc(pt, 1000), c = alloc(pt, 100 * kKiB);
  EXPECT_EQ(a.size, 1024u);
  EXPECT_EQ(b.p, a.p + 1024);  // the remainder after a, split off because >= 512 B remained
  EXPECT_EQ(c.p, b.p + 1024);
  EXPECT_EQ(c.size, 100 * kKiB);
  EXPECT_EQ(sim.used(), 2 * kMiB);
  EXPECT_EQ(sim.counters().segment_allocs, 1u);
}

TEST(PyTorchPolicy, LargeBlocksSplitOnlyWhenMoreThan1MiBRemains) {
  SimBackend sim(1ull << 40);
  PT pt(sim, false);
  const Got a = alloc(pt, 5 * kMiB);  // a 20 MiB segment; 15 MiB remain, split off
  EXPECT_EQ(a.size, 5 * kMiB);
  EXPECT_EQ(sim.used(), 20 * kMiB);
  const Got b = alloc(pt, 14 * kMiB + 512 * kKiB);  // from the 15 MiB: 512 KiB would remain, not split
  EXPECT_EQ(b.p, a.p + 5 * kMiB);
  EXPECT_EQ(b.size, 15 * kMiB);
  EXPECT_EQ(sim.used(), 20 * kMiB);
}

TEST(PyTorchPolicy, BestFitTakesTheSmallestFreeBlockThatFits) {
  SimBackend sim(1ull << 40);
  PT pt(sim, false);
  const Got big = alloc(pt, 14 * kMiB), small = alloc(pt, 12 * kMiB);  // exact segments
  release(pt, big);
  release(pt, small);
  const Got c = alloc(pt, 11 * kMiB);  // both fit; the 12 MiB one is the best; 1 MiB left: no split
  EXPECT_EQ(c.p, small.p);
  EXPECT_EQ(c.size, 12 * kMiB);
  const Got d = alloc(pt, 11 * kMiB);  // then the 14 MiB one, split (3 MiB remain)
  EXPECT_EQ(d.p, big.p);
  EXPECT_EQ(d.size, 11 * kMiB);
  EXPECT_EQ(sim.counters().segment_allocs, 2u);
}

TEST(PyTorchPolicy, FreedNeighboursCoalesceSoTheSegmentCanBeReleased) {
  SimBackend sim(1ull << 40);
  PT pt(sim, false);
  const Got a = alloc(pt, 512), b = alloc(pt, 512), c = alloc(pt, 512);
  release(pt, a);
  release(pt, c);
  pt.release_cached();  // b still splits the segment: nothing can go back
  EXPECT_EQ(sim.used(), 2 * kMiB);
  release(pt, b);  // merges with a before it and with c and the tail after it
  PoolFigures f;
  pt.figures(&f);
  EXPECT_EQ(f.largest_free_block, 2 * kMiB);
  pt.release_cached();
  EXPECT_EQ(sim.used(), 0u);
  EXPECT_EQ(sim.counters().segment_frees, 1u);
}

TEST(PyTorchPolicy, FreeBlocksServeOnlyTheirOwnStream) {
  SimBackend sim(1ull << 40);
  PT pt(sim, false);
  const Got a = alloc(pt, 1000, 1);
  release(pt, a, 1);
  const Got b = alloc(pt, 1000, 2);
  EXPECT_NE(b.p, a.p);
  EXPECT_EQ(sim.used(), 4 * kMiB);
  const Got c = alloc(pt, 1000, 1);  // stream 1 reuses its own block at once: no synchronization
  EXPECT_EQ(c.p, a.p);
  EXPECT_EQ(sim.counters().synchronizes, 0u);
}

TEST(PyTorchPolicy, OnOomReleasesCachedSegmentsAndRetriesOnce) {
  SimBackend sim(40 * kMiB);
  PT pt(sim, false);
  release(pt, alloc(pt, 12 * kMiB));  // cached: 12 MiB reserved, nothing live
  const Got big = alloc(pt, 30 * kMiB);  // 12 + 30 > 40: release the cached segment, then it fits
  EXPECT_EQ(big.size, 30 * kMiB);
  EXPECT_EQ(sim.used(), 30 * kMiB);
  EXPECT_EQ(sim.counters().segment_frees, 1u);
  EXPECT_EQ(pt.synchronizations(), 1u);  // cudaFree synchronizes the device
  void* p = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(pt.allocate(AllocRequest{12 * kMiB, nullptr, false}, &p, &size), CUDA_ERROR_OUT_OF_MEMORY);
  PoolFigures f;
  pt.figures(&f);
  EXPECT_EQ(f.ooms, 1u);
  EXPECT_EQ(f.alloc_retries, 2u);
}

TEST(PyTorchPolicy, ExpandableSegmentsGrowOneRangeByPages) {
  SimBackend sim(1ull << 34);  // 16 GiB: the range reserves 18 GiB of address space
  PT pt(sim, true);
  const Got a = alloc(pt, 5 * kMiB);  // large pool: one 20 MiB page
  EXPECT_EQ(sim.used(), 20 * kMiB);
  const Got b = alloc(pt, 18 * kMiB);  // 15 MiB free at the tail + one more page, contiguous
  EXPECT_EQ(b.p, a.p + 5 * kMiB);
  EXPECT_EQ(b.size, 18 * kMiB);
  EXPECT_EQ(sim.used(), 40 * kMiB);
  const Got c = alloc(pt, 3 * kMiB);  // 17 MiB free at the tail: no new page
  EXPECT_EQ(c.p, b.p + 18 * kMiB);
  EXPECT_EQ(sim.used(), 40 * kMiB);
  const Got s = alloc(pt, 1000);  // small pool: a range of its own, 2 MiB pages
  EXPECT_EQ(s.size, 1024u);
  EXPECT_EQ(sim.used(), 42 * kMiB);
  EXPECT_EQ(pt.segment_count(), 2u);
  EXPECT_EQ(sim.counters().va_reserves, 2u);
  EXPECT_EQ(sim.counters().segment_allocs, 0u);  // no cudaMalloc at all
  for (Got g : {a, b, c, s}) release(pt, g);
  pt.release_cached();  // every page unmapped, the ranges given back
  EXPECT_EQ(sim.used(), 0u);
  EXPECT_EQ(pt.segment_count(), 0u);
  EXPECT_EQ(sim.counters().va_frees, 2u);
}

TEST(PyTorchPolicy, ExpandableReleaseUnmapsOnlyWholeFreePages) {
  SimBackend sim(1ull << 34);
  PT pt(sim, true);
  const Got a = alloc(pt, 5 * kMiB), b = alloc(pt, 30 * kMiB);  // 35 MiB: two 20 MiB pages
  EXPECT_EQ(sim.used(), 40 * kMiB);
  release(pt, b);
  pt.release_cached();  // free [5, 40) MiB: only the page [20, 40) is whole
  EXPECT_EQ(sim.used(), 20 * kMiB);
  EXPECT_EQ(sim.counters().unmaps, 1u);
  EXPECT_EQ(pt.synchronizations(), 1u);  // PyTorch synchronizes the stream before unmapping
  const Got c = alloc(pt, 30 * kMiB);  // fits again at the same place, mapping the page again
  EXPECT_EQ(c.p, a.p + 5 * kMiB);
  EXPECT_EQ(sim.used(), 40 * kMiB);
}

TEST(PyTorchPolicy, ExpandableMapsAgainAfterAnOomReleasesFreePages) {
  SimBackend sim(60 * kMiB);
  PT pt(sim, true);
  const Got a = alloc(pt, 30 * kMiB);  // 2 pages
  const Got s = alloc(pt, 1000);       // small range: 1 page of 2 MiB
  release(pt, s);
  EXPECT_EQ(sim.used(), 42 * kMiB);
  // 20 more MiB: a third large page would need 62 MiB; the free small page is unmapped, then it fits.
  const Got b = alloc(pt, 20 * kMiB);
  EXPECT_EQ(b.p, a.p + 30 * kMiB);
  EXPECT_EQ(sim.used(), 60 * kMiB);
  release(pt, a);
  release(pt, b);
}

// Random sizes on three streams, on a device small enough for OOMs and releases: blocks never
// overlap, the allocator's reserve is what the device holds, and everything goes back at the end.
TEST(PyTorchPolicy, RandomChurnKeepsBlocksDisjointAndAccountingExact) {
  for (bool expandable : {false, true}) {
    SimBackend sim(400 * kMiB);
    PT pt(sim, expandable);
    std::map<uintptr_t, std::pair<uint64_t, uintptr_t>> live;  // address -> size, stream
    uint64_t x = 88172645463325252ull;
    auto next = [&x] { return x ^= x << 13, x ^= x >> 7, x ^= x << 17; };
    int ooms = 0;
    for (int i = 0; i < 20000; ++i) {
      if (!live.empty() && next() % 100 < 48) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(next() % std::min<size_t>(live.size(), 64)));
        ASSERT_EQ(pt.deallocate(reinterpret_cast<void*>(it->first), pytorch_stream(it->second.second), false), CUDA_SUCCESS);
        live.erase(it);
      } else {
        const uint64_t r = next() % 100;
        const uint64_t bytes = r < 60 ? 1 + next() % (64 * kKiB) : r < 90 ? 1 + next() % (4 * kMiB) : 1 + next() % (40 * kMiB);
        const uintptr_t s = next() % 3;
        void* p = nullptr;
        uint64_t size = 0;
        if (pt.allocate(AllocRequest{bytes, pytorch_stream(s), false}, &p, &size) != CUDA_SUCCESS) {
          ++ooms;
          continue;
        }
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        ASSERT_GE(size, bytes);
        auto after = live.lower_bound(a);
        ASSERT_TRUE(after == live.end() || a + size <= after->first) << i;
        ASSERT_TRUE(after == live.begin() || std::prev(after)->first + std::prev(after)->second.first <= a) << i;
        ASSERT_TRUE(pt.contains(p));
        live[a] = {size, s};
      }
      ASSERT_EQ(pt.reserved_bytes(), sim.used()) << i;
      ASSERT_LE(sim.used(), 400 * kMiB);
    }
    EXPECT_GT(ooms, 0) << "the device should have run short";
    EXPECT_GT(pt.synchronizations(), 0u);
    for (auto& [a, v] : live) ASSERT_EQ(pt.deallocate(reinterpret_cast<void*>(a), pytorch_stream(v.second), false), CUDA_SUCCESS);
    pt.release_cached();
    EXPECT_EQ(sim.used(), 0u) << expandable;
    EXPECT_EQ(pt.segment_count(), 0u) << expandable;
  }
}

// A request the device cannot hold is refused before any page is made: expandable segments mapped
// one 20 MiB page after another until the device ran out, so a corrupt size in a trace (exabytes)
// made billions of driver calls, minutes and gigabytes, for one refusal.
TEST(PyTorchPolicy, ARequestPastTheDeviceMakesNoPage) {
  SimBackend sim(1ull << 30);
  PT pt(sim, /*expandable=*/true);
  const uint64_t before = sim.counters().physical_creates;
  void* p = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(pt.allocate(AllocRequest{1ull << 62, pytorch_stream(0), false}, &p, &size), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(sim.counters().physical_creates, before);  // not one page made for it
  EXPECT_EQ(sim.used(), 0u);
  Got g = alloc(pt, 30 * kMiB);  // the device is still whole
  release(pt, g);
}

// A small trace through replay_trace: the figures follow from the rules above.
TEST(PyTorchPolicy, ReplayFiguresOnASmallTrace) {
  TraceData t;
  t.header.policy = "passthrough";
  t.devices.push_back(trace::DeviceInfo{0, 1ull << 34, 0});
  auto ev = [](EventKind kind, uint64_t t_ns, uint64_t addr, uint64_t size) {
    TraceEvent e;
    e.kind = kind;
    e.t_ns = t_ns;
    e.addr = addr;
    e.size = e.requested = size;
    return e;
  };
  // 3 MiB + 100 B, 700 KiB, 25 MiB; free the first; 2 MiB; free all.
  t.events = {ev(EventKind::kAlloc, 1, 0x1000, 3 * kMiB + 100), ev(EventKind::kAlloc, 2, 0x2000, 700 * kKiB),
              ev(EventKind::kAlloc, 3, 0x3000, 25 * kMiB),      ev(EventKind::kFree, 4, 0x1000, 0),
              ev(EventKind::kAlloc, 5, 0x4000, 2 * kMiB),       ev(EventKind::kFree, 6, 0x2000, 0),
              ev(EventKind::kFree, 7, 0x3000, 0),               ev(EventKind::kFree, 8, 0x4000, 0)};
  ReplaySettings s;
  s.model = ReplayModel::kPyTorch;
  const ReplayResult r = replay_trace(t, s);
  EXPECT_EQ(r.policy, "pytorch");
  ASSERT_EQ(r.devices.size(), 1u);
  const ReplayDevice& d = r.devices[0];
  // Segments: 20 MiB (3 MiB + 512 B block, 17 MiB - 512 remain), 2 MiB (700 KiB), 26 MiB (25 MiB,
  // 1 MiB remains: no split). The 2 MiB request is served from the first segment's free space.
  EXPECT_EQ(d.peak_reserved, 48 * kMiB);
  EXPECT_EQ(d.peak_requested, 3 * kMiB + 100 + 700 * kKiB + 25 * kMiB);
  EXPECT_EQ(d.peak_allocated, 3 * kMiB + 512 + 700 * kKiB + 26 * kMiB);
  EXPECT_EQ(d.driver.segment_allocs, 3u);
  EXPECT_EQ(d.driver.synchronizes, 0u);

  s.model = ReplayModel::kPyTorchExpandable;
  const ReplayResult e = replay_trace(t, s);
  EXPECT_EQ(e.policy, "pytorch-expandable");
  // Large range: 3 MiB + 512, then 25 MiB behind it (28 MiB + 512: two 20 MiB pages); the 2 MiB
  // request takes the freed 3 MiB block at the front. Small range: one 2 MiB page.
  EXPECT_EQ(e.devices[0].peak_reserved, 42 * kMiB);
  EXPECT_EQ(e.devices[0].peak_allocated, 3 * kMiB + 512 + 700 * kKiB + 25 * kMiB);
  EXPECT_EQ(e.devices[0].driver.segment_allocs, 0u);
}

// Synchronizations are counted apart from the second iteration mark on (the steady state).
TEST(PyTorchPolicy, ReplayCountsSteadyStateSynchronizationsApart) {
  auto ev = [](EventKind kind, uint64_t addr, uint64_t size) {
    TraceEvent e;
    e.kind = kind;
    e.addr = addr;
    e.size = e.requested = size;
    return e;
  };
  auto mark = [](uint64_t n) {
    TraceEvent e;
    e.kind = EventKind::kIteration;
    e.size = n;
    return e;
  };
  // On a 40 MiB device the 30 MiB block needs the cached 12 MiB segment released: one sync.
  const std::vector<TraceEvent> releasing{ev(EventKind::kAlloc, 0xA, 12 * kMiB), ev(EventKind::kFree, 0xA, 0),
                                          ev(EventKind::kAlloc, 0xB, 30 * kMiB), ev(EventKind::kFree, 0xB, 0)};
  const std::vector<TraceEvent> reusing{ev(EventKind::kAlloc, 0xC, 30 * kMiB), ev(EventKind::kFree, 0xC, 0)};
  auto replay = [&](std::vector<TraceEvent> events, ReplayModel model = ReplayModel::kPyTorch,
                    uint64_t capacity = 40 * kMiB) {
    TraceData t;
    t.header.policy = "passthrough";
    t.devices.push_back(trace::DeviceInfo{0, capacity, 0});
    t.events = std::move(events);
    ReplaySettings s;
    s.model = model;
    return replay_trace(t, s).devices.at(0);
  };
  std::vector<TraceEvent> warmup{mark(1)};
  warmup.insert(warmup.end(), releasing.begin(), releasing.end());
  warmup.push_back(mark(2));
  warmup.insert(warmup.end(), reusing.begin(), reusing.end());
  const ReplayDevice a = replay(warmup);
  EXPECT_EQ(a.driver.synchronizes, 1u);
  EXPECT_EQ(a.steady_synchronizes, 0);

  std::vector<TraceEvent> late{mark(1), mark(2)};
  late.insert(late.end(), releasing.begin(), releasing.end());
  const ReplayDevice b = replay(late);
  EXPECT_EQ(b.driver.synchronizes, 1u);
  EXPECT_EQ(b.steady_synchronizes, 1);

  EXPECT_EQ(replay(releasing).steady_synchronizes, -1);  // no marks: no steady state known

  // Mappings are counted apart too: expandable segments map the 12 and 30 MiB blocks' pages where
  // they first come, and map nothing for the block that reuses them.
  auto replay_expandable = [&](std::vector<TraceEvent> events) {
    return replay(std::move(events), ReplayModel::kPyTorchExpandable, 1024 * kMiB);
  };
  const ReplayDevice c = replay_expandable(warmup);
  EXPECT_GT(c.driver.maps, 0u);
  EXPECT_EQ(c.steady_maps, 0);
  EXPECT_EQ(c.steady_unmaps, 0);
  const ReplayDevice d = replay_expandable(late);
  EXPECT_EQ(d.driver.maps, c.driver.maps);
  EXPECT_EQ(static_cast<uint64_t>(d.steady_maps), d.driver.maps);
  EXPECT_EQ(replay_expandable(releasing).steady_maps, -1);
}

}  // namespace
}  // namespace gpushim::analysis
