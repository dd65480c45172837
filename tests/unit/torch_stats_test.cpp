// torch_stats.h, the one definition of PyTorch's statistics that the core keeps and the analysis
// computes from a trace: its rules, and the caching pool's block places against a brute-force
// reading of the same layout.
#include "accounting/torch_stats.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "accounting/pooled_records.h"
#include "policy/caching_pool.h"
#include "policy/observed_backend.h"
#include "policy/sim_backend.h"
#include "test_scale.h"
#include "test_sizes.h"

namespace gpushim {
namespace {

using namespace torch_stats;

TEST(TorchStats, PoolsAreSplitAtPyTorchsSizes) {
  EXPECT_EQ(block_pool(MiB), kSmall);
  EXPECT_EQ(block_pool(MiB + 512), kLarge);
  EXPECT_EQ(segment_pool(2 * MiB), kSmall);
  EXPECT_EQ(segment_pool(20 * MiB), kLarge);
}

TEST(TorchStats, StatKeepsPeakAndTotalsAlikeLockedOrShared) {
  Stat locked, shared;
  for (int64_t d : {5, 7, -3, 10, -19, 4}) {
    locked.add<Sync::kLocked>(d);
    shared.add<Sync::kShared>(d);
  }
  EXPECT_EQ(locked.values(), (Values{4, 19, 26, 22}));
  EXPECT_EQ(shared.values(), locked.values());
  locked.add<Sync::kLocked>(-100);  // a lost event never wraps the figure
  EXPECT_EQ(locked.values(), (Values{0, 19, 26, 26}));
}

TEST(TorchStats, BlocksSegmentsAndForwardedMemoryMoveTheirPools) {
  DeviceStats s;
  s.segment<Sync::kLocked>(2 * MiB, +1);
  s.block<Sync::kLocked>(4 * KiB, 4000, +1);
  s.forwarded<Sync::kLocked>(64 * MiB, 64 * MiB, +1);
  Figures f = s.snapshot();
  EXPECT_EQ(f.stat[kAllocation][kAll].current, 2u);
  EXPECT_EQ(f.stat[kAllocation][kSmall].current, 1u);
  EXPECT_EQ(f.stat[kSegment][kLarge].current, 1u);  // the forwarded one's own
  EXPECT_EQ(f.stat[kSegment][kSmall].current, 1u);
  EXPECT_EQ(f.stat[kReservedBytes][kAll].current, 66 * MiB);
  EXPECT_EQ(f.stat[kRequestedBytes][kAll].current, 4000 + 64 * MiB);
  EXPECT_EQ(f.stat[kActiveBytes][kLarge], f.stat[kAllocatedBytes][kLarge]);
  s.forwarded<Sync::kLocked>(64 * MiB, 64 * MiB, -1);
  f = s.snapshot();
  EXPECT_EQ(f.stat[kAllocatedBytes][kAll], (Values{4 * KiB, 64 * MiB + 4 * KiB, 64 * MiB + 4 * KiB, 64 * MiB}));
  EXPECT_EQ(f.stat[kSegment][kAll], (Values{1, 2, 2, 1}));
  EXPECT_TRUE(f.split_known);
  s.split_unknown();
  EXPECT_FALSE(s.snapshot().split_known);
}

TEST(TorchStats, FreePiecesOfASegmentInUse) {
  // A 2 MiB segment: a block at its start leaves one free piece after it; a second block right
  // after the first shrinks that piece; one in the middle of the rest splits it in two.
  const uint64_t seg = 2 * MiB;
  SplitChange c = split_on_alloc(512 * KiB, Place{seg, true, false, true});
  EXPECT_EQ(c.bytes, static_cast<int64_t>(1536 * KiB));
  EXPECT_EQ(c.pieces, 1);
  c = split_on_alloc(256 * KiB, Place{seg, false, false, true});
  EXPECT_EQ(c.bytes, -static_cast<int64_t>(256 * KiB));
  EXPECT_EQ(c.pieces, 0);
  c = split_on_alloc(256 * KiB, Place{seg, false, true, true});
  EXPECT_EQ(c.pieces, 1);
  // The last block leaving makes the segment releasable: its free space is no longer counted.
  c = split_on_free(512 * KiB, Place{seg, true, false, true});
  EXPECT_EQ(c.bytes, -static_cast<int64_t>(1536 * KiB));
  EXPECT_EQ(c.pieces, -1);
}

TEST(TorchStats, MappedRunsCountAdjacentMappingsAsOneSegment) {
  MappedRuns r;
  EXPECT_EQ(r.map(0x100000, 0x1000), 1);
  EXPECT_EQ(r.map(0x101000, 0x1000), 0);   // grows the run
  EXPECT_EQ(r.map(0x0ff000, 0x1000), 0);   // grows it downwards
  EXPECT_EQ(r.map(0x104000, 0x1000), 1);   // apart
  EXPECT_EQ(r.map(0x102000, 0x2000), -1);  // joins the two
  uint64_t base = 0, end = 0;
  ASSERT_TRUE(r.containing(0x103000, 0x1000, &base, &end));
  EXPECT_EQ(base, 0x0ff000u);
  EXPECT_EQ(end, 0x105000u);
  EXPECT_EQ(r.unmap(0x102000, 0x1000), 1);  // splits it
  EXPECT_EQ(r.unmap(0x0ff000, 0x1000), 0);  // trims one end
  EXPECT_EQ(r.unmap(0x100000, 0x2000), -1);
  EXPECT_EQ(r.unmap(0x200000, 0x1000), 0);  // never mapped
}

// The pool's segments, as the ledger's backend adaptor sees them.
class Segments final : public SegmentObserver {
 public:
  explicit Segments(DeviceStats& s) : stats_(s) {}
  void on_segment(Change change, uintptr_t addr, uint64_t bytes, bool) override {
    if (change == Change::kAlloc) {
      map_[addr] = bytes;
      stats_.segment<Sync::kLocked>(bytes, +1);
    } else if (change == Change::kFree) {
      map_.erase(addr);
      stats_.segment<Sync::kLocked>(bytes, -1);
    }
  }
  std::map<uintptr_t, uint64_t> map_;

 private:
  DeviceStats& stats_;
};

TEST(TorchStats, CachingPoolPlacesGiveTheFreePiecesOfItsLayout) {
  SimBackend sim(8ull << 30);
  DeviceStats torch;
  Segments segments(torch);
  ObservedBackend observed(sim, segments);
  CachingPool pool(observed, CachingPoolOptions{});
  ASSERT_TRUE(pool.places_blocks());
  MemoryCounters counters;
  PooledSites sites;
  AllocationTracker tracker;
  std::map<uintptr_t, uint64_t> live;
  std::mt19937_64 rng(31);
  const int ops = scaled(3000, 900);
  Values expect_bytes, expect_pieces;  // brute force, every step
  auto follow = [](Values& v, uint64_t now) {
    if (now > v.current) v.allocated += now - v.current;
    else v.freed += v.current - now;
    v.current = now;
    v.peak = std::max(v.peak, now);
  };
  for (int i = 0; i < ops; ++i) {
    const bool alloc = live.size() < 4 || (live.size() < 64 && rng() % 2 == 0);
    if (alloc) {
      const uint64_t n = 256ull << (rng() % 15);  // 256 B .. 4 MiB
      AllocationRecord rec{0, n, 1, 1, 0, MemoryKind::kDevice, Route::kPooled, 0};
      PooledAlloc hooks(counters, sites, tracker, torch, rec, false);
      void* p = nullptr;
      uint64_t got = 0;
      ASSERT_EQ(pool.allocate_with(AllocRequest{n, nullptr, rng() % 4 == 0}, &p, &got, hooks), CUDA_SUCCESS);
      live[reinterpret_cast<uintptr_t>(p)] = got;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      PooledFree hooks(counters, sites, tracker, torch, false);
      ASSERT_EQ(pool.deallocate_with(reinterpret_cast<void*>(it->first), nullptr, false, hooks), CUDA_SUCCESS);
      live.erase(it);
    }
    if (rng() % 200 == 0) pool.release_cached();
    // The free pieces of every segment with a live block in it.
    uint64_t bytes = 0, pieces = 0;
    for (const auto& [base, size] : segments.map_) {
      uint64_t at = base, in_use = 0;
      uint64_t seg_bytes = 0, seg_pieces = 0;
      for (auto b = live.lower_bound(base); b != live.end() && b->first < base + size; ++b, ++in_use) {
        if (b->first > at) seg_bytes += b->first - at, ++seg_pieces;
        at = b->first + b->second;
      }
      if (at < base + size) seg_bytes += base + size - at, ++seg_pieces;
      if (in_use) bytes += seg_bytes, pieces += seg_pieces;
    }
    follow(expect_bytes, bytes);
    follow(expect_pieces, pieces);
    const Figures f = torch.snapshot();
    ASSERT_EQ(f.stat[kInactiveSplitBytes][kAll], expect_bytes) << "op " << i;
    ASSERT_EQ(f.stat[kInactiveSplit][kAll], expect_pieces) << "op " << i;
  }
  const Figures f = torch.snapshot();
  EXPECT_GT(f.stat[kInactiveSplit][kAll].peak, 1u);  // the layouts were not trivial
  EXPECT_EQ(f.stat[kAllocation][kAll].current, live.size());
  EXPECT_EQ(f.stat[kInactiveSplitBytes][kLarge].current + f.stat[kInactiveSplitBytes][kSmall].current,
            f.stat[kInactiveSplitBytes][kAll].current);
}

}  // namespace
}  // namespace gpushim
