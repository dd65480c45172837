#include "policy/vmm_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "fragmentation_workload.h"
#include "policy/device_budget.h"
#include "policy/limited_backend.h"
#include "policy/policy_factory.h"
#include "policy/sim_backend.h"
#include "util/log.h"
#include "test_sizes.h"
#include "vmm_test_pool.h"

namespace gpushim {
namespace {

// ---- the shim's own memory ----

TEST(VmmPool, CountsItsOwnHostMemoryAndItFollowsWhatItHolds) {
  Vmm v;
  const uint64_t empty = v.fig().host_bytes;
  EXPECT_GT(empty, 0u);
  std::vector<void*> live;
  for (int i = 0; i < 200; ++i) live.push_back(v.alloc((i % 2 ? 3 : 5) * MiB + 4096 * i));
  for (int i = 0; i < 200; ++i) live.push_back(v.alloc(1000 + 64 * i));  // small: sub-allocated
  const uint64_t busy = v.fig().host_bytes;
  EXPECT_GT(busy, empty + 200 * 64) << "each live block costs metadata";
  EXPECT_LT(busy, empty + 400 * 2048) << "a few hundred bytes per block, not more";
  for (void* p : live) ASSERT_EQ(v.free(p), CUDA_SUCCESS);
  // Repeating the same work reuses what the pool holds: its metadata does not keep growing.
  for (int round = 0; round < 5; ++round) {
    live.clear();
    for (int i = 0; i < 200; ++i) live.push_back(v.alloc((i % 2 ? 3 : 5) * MiB + 4096 * i));
    for (void* p : live) ASSERT_EQ(v.free(p), CUDA_SUCCESS);
  }
  EXPECT_LT(v.fig().host_bytes, busy * 2);
}

// ---- basics ----

TEST(VmmPool, AllocatesMapsAndReusesABlockAsIs) {
  Vmm v;
  uint64_t got = 0;
  void* a = v.alloc(11 * MiB, nullptr, false, &got);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(got, 11 * MiB) << "blocks are rounded to 512 B, not to chunks";
  PoolFigures f = v.fig();
  EXPECT_EQ(f.reserved_bytes, 12 * MiB) << "the chunks it touches";
  EXPECT_EQ(f.map_calls, 6u) << "one map per chunk";
  EXPECT_EQ(f.mapped_bytes, 12 * MiB);
  EXPECT_EQ(f.cached_free_bytes, 1 * MiB) << "the rest of the last chunk is free for the next block";
  EXPECT_EQ(v.sim.used(), 12 * MiB);
  EXPECT_EQ(v.sim.counters().physical_creates, 6u);
  EXPECT_TRUE(v.pool.contains(static_cast<char*>(a) + 11 * MiB - 1));
  ASSERT_EQ(v.free(a, nullptr, true), CUDA_SUCCESS);  // stream-ordered, event complete at once
  EXPECT_EQ(v.alloc(11 * MiB), a) << "a freed block is reused where it is, still mapped";
  EXPECT_EQ(v.fig().map_calls, 6u);
  EXPECT_EQ(v.pool.check_invariants(), "");
  EXPECT_TRUE(v.pool.is_vmm());
}

TEST(VmmPool, PointersAreAlignedAndSizesRounded) {
  Vmm v(64 * GiB);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t n = 1 + (rng() % 3 == 0 ? rng() % (64 * MiB) : rng() % (1 * MiB));
    uint64_t got = 0;
    void* p = v.alloc(n, nullptr, false, &got);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(addr(p) % 512, 0u) << n;
    EXPECT_LT(got - n, 512u) << "every block is rounded to 512 B, nothing more";
    if (rng() % 2) v.free(p, nullptr, rng() % 2);
  }
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, ClassicPointersAreAlignedAndSizesRounded) {
  Vmm v(64 * GiB, classic());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t n = 1 + (rng() % 3 == 0 ? rng() % (64 * MiB) : rng() % (1 * MiB));
    uint64_t got = 0;
    void* p = v.alloc(n, nullptr, false, &got);
    ASSERT_NE(p, nullptr);
    EXPECT_GE(got, n);
    if (n <= v.pool.options().small_max) {
      EXPECT_EQ(addr(p) % 512, 0u) << n;
      EXPECT_LT(got - n, 512u) << "small blocks are rounded to 512 B, nothing more";
    } else if (n <= v.pool.options().medium_max) {
      EXPECT_EQ(addr(p) % 512, 0u) << n;
      EXPECT_LE(got - n, MiB + 512) << "medium blocks keep a remainder of up to 1 MiB, as in the caching policy";
    } else {
      EXPECT_EQ(addr(p) % (2 * MiB), 0u) << n;
      EXPECT_LT(got - n, 2 * MiB) << "large blocks are rounded to whole chunks";
    }
    if (rng() % 2) v.free(p, nullptr, rng() % 2);
  }
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, NeighboursShareAChunkAndAFreedChunkMovesAcrossBlocks) {
  Vmm v;
  void* a = v.alloc(1 * MiB);
  void* b = v.alloc(1 * MiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(addr(b), addr(a) + 1 * MiB) << "packed";
  EXPECT_EQ(v.sim.used(), 2 * MiB) << "two blocks, one chunk";
  void* c = v.alloc(2 * MiB);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(v.sim.used(), 4 * MiB);
  // Freed on two streams, the two blocks stay apart in the free set; together they cover their
  // chunk, which can then be unmapped and mapped where a larger block goes.
  ASSERT_EQ(v.free(a, vmm_stream(0x100), true), CUDA_SUCCESS);
  ASSERT_EQ(v.free(b, vmm_stream(0x200), true), CUDA_SUCCESS);
  ASSERT_NE(v.alloc(4 * MiB), nullptr);
  EXPECT_EQ(v.sim.used(), 6 * MiB) << "the freed chunk became half of the new block";
  EXPECT_EQ(v.pool.stats().pieces_moved, 1u);
  EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, SmallBlocksLiveInRangesOfTheirOwnAndTheirChunksServeLargeOnes) {
  VmmPoolOptions o;
  o.small_class_max = 256 << 10;  // one class by default (see VmmPoolOptions)
  Vmm v(4 * GiB, o);
  void* a = v.alloc(64 << 10);
  void* b = v.alloc(4 * MiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(v.sim.reservations(), 2u) << "one virtual range per size class";
  EXPECT_FALSE(addr(b) < addr(a) + 2 * MiB && addr(a) < addr(b) + 4 * MiB);
  EXPECT_EQ(v.sim.used(), 6 * MiB);
  ASSERT_EQ(v.free(a), CUDA_SUCCESS);
  v.sim.complete_events();
  ASSERT_NE(v.alloc(2 * MiB), nullptr);
  EXPECT_EQ(v.sim.used(), 6 * MiB) << "the small range's emptied chunk moved to the large one";
  EXPECT_EQ(v.pool.stats().pieces_moved, 1u);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, SmallRequestsShareChunks) {
  Vmm v(4 * GiB, classic());
  ASSERT_EQ(v.pool.options().small_segment, 4 * MiB);
  std::vector<void*> small;
  for (int i = 0; i < 1000; ++i) small.push_back(v.alloc(1000));  // 512 KiB after rounding... twice over
  for (void* p : small) ASSERT_NE(p, nullptr);
  EXPECT_EQ(v.fig().reserved_bytes, 4 * MiB) << "a thousand small requests fit one segment";
  EXPECT_EQ(v.sim.counters().physical_creates, 2u) << "of two chunks";
  EXPECT_EQ(v.fig().map_calls, 2u);
  // 10 MiB more: about 3 MiB still free in the first segment, then two more segments.
  for (int i = 0; i < 100; ++i) ASSERT_NE(v.alloc(100 << 10), nullptr);
  EXPECT_EQ(v.fig().reserved_bytes, 4 * MiB + 2 * 4 * MiB);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, EmptySmallSegmentsGoBackAsFreeChunks) {
  Vmm v(4 * GiB, classic());
  std::vector<void*> small;
  for (int i = 0; i < 100; ++i) small.push_back(v.alloc(512 << 10));  // 13 segments of 4 MiB
  EXPECT_EQ(v.fig().reserved_bytes, 52 * MiB);
  for (void* p : small) v.free(p);
  v.pool.release_cached();
  EXPECT_EQ(v.sim.used(), 0u) << "every chunk goes back once nothing uses it";
  EXPECT_EQ(v.sim.mapped_bytes(), 0u);
  EXPECT_EQ(v.sim.reservations(), 0u) << "and every virtual range";
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, SizesNearTwoToTheSixtyFourAreRefusedNotWrapped) {
  // 512 B rounding leaves room below 2^64 that whole chunks would not: the chunks a build maps
  // must not wrap either.
  Vmm v;
  void* a = v.alloc(1 * MiB);
  ASSERT_NE(a, nullptr);
  for (uint64_t n : std::vector<uint64_t>{UINT64_MAX, UINT64_MAX - 511, UINT64_MAX - 1 * MiB, UINT64_MAX - 3 * MiB, 1ull << 63}) {
    void* p = reinterpret_cast<void*>(1);
    uint64_t got = 7;
    EXPECT_EQ(v.pool.allocate(AllocRequest{n, nullptr, false}, &p, &got), CUDA_ERROR_OUT_OF_MEMORY) << n;
  }
  EXPECT_NE(v.alloc(1 * MiB), nullptr) << "the pool still serves";
  EXPECT_EQ(v.free(a), CUDA_SUCCESS);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, UnknownPointerIsInvalid) {
  Vmm v;
  void* s = v.alloc(1000);
  void* l = v.alloc(8 * MiB);
  EXPECT_EQ(v.free(static_cast<char*>(s) + 512), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(v.free(static_cast<char*>(l) + 512), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(v.free(s), CUDA_SUCCESS);
  EXPECT_EQ(v.free(l), CUDA_SUCCESS);
  EXPECT_EQ(v.free(s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(v.free(l), CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(v.pool.contains(static_cast<char*>(l) + 100));
  EXPECT_FALSE(v.pool.contains(reinterpret_cast<void*>(0x1000)));
}

// ---- stitching and growth ----

TEST(VmmPool, StitchesScatteredFreeChunksIntoOneRange) {
  Vmm v(200 * MiB);  // exactly ten 20 MiB blocks
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(v.alloc(20 * MiB));
  for (void* p : blocks) ASSERT_NE(p, nullptr);
  std::map<uintptr_t, std::vector<std::pair<uint64_t, uint64_t>>> live;
  for (int i = 0; i < 10; i += 2) ASSERT_EQ(v.free(blocks[i], nullptr, true), CUDA_SUCCESS);
  for (int i = 1; i < 10; i += 2) live[addr(blocks[i])] = backing(v.sim, addr(blocks[i]), 20 * MiB);
  EXPECT_EQ(v.fig().largest_free_block, 20 * MiB);
  const uint64_t creates = v.sim.counters().physical_creates;
  // No 100 MiB range is free anywhere, and the device is full: only remapping can serve this.
  void* big = v.alloc(100 * MiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(v.sim.used(), 200 * MiB) << "no physical memory beyond capacity";
  EXPECT_EQ(v.sim.counters().physical_creates, creates);
  EXPECT_EQ(v.sim.counters().unmaps, 50u) << "each free chunk moves with one unmap";
  EXPECT_EQ(v.sim.counters().maps, 150u) << "... and one map";
  const VmmStats st = v.pool.stats();
  EXPECT_EQ(st.stitches, 1u);
  EXPECT_EQ(st.pieces_moved, 50u);
  for (auto& [a, b] : live) {
    EXPECT_EQ(backing(v.sim, a, 20 * MiB), b) << "a live block's memory never moves";
    EXPECT_TRUE(addr(big) + 100 * MiB <= a || a + 20 * MiB <= addr(big)) << "overlaps a live block";
  }
  uint64_t h = 0, off = 0;
  EXPECT_TRUE(v.sim.translate(addr(big) + 100 * MiB - 1, &h, &off)) << "the stitched range is mapped end to end";
  EXPECT_EQ(v.pool.check_invariants(), "");
  EXPECT_EQ(v.fig().ooms, 0u);
}

TEST(VmmPool, GrowsAFreeBlockInPlaceByWhatItLacks) {
  Vmm v;
  void* a = v.alloc(30 * MiB);
  ASSERT_EQ(v.free(a, nullptr, true), CUDA_SUCCESS);
  void* b = v.alloc(50 * MiB);
  EXPECT_EQ(b, a) << "the free 30 MiB block is extended where it is";
  EXPECT_EQ(v.fig().reserved_bytes, 50 * MiB) << "only the 20 MiB it lacked was created";
  EXPECT_EQ(v.sim.counters().maps, 25u) << "15 chunks, then the 10 it lacked";
  EXPECT_EQ(v.sim.counters().unmaps, 0u);
  EXPECT_EQ(v.pool.stats().grows_in_place, 1u);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, GrowsInPlaceAcrossReservationsThroughTheAddressHint) {
  VmmPoolOptions o;
  o.reserve = 0;  // reserve exactly what is mapped: any growth needs the range after it
  Vmm v(4 * GiB, o);
  void* a = v.alloc(30 * MiB);
  ASSERT_EQ(v.free(a, nullptr, true), CUDA_SUCCESS);
  void* b = v.alloc(50 * MiB);
  EXPECT_EQ(b, a);
  EXPECT_EQ(v.fig().reserved_bytes, 50 * MiB);
  EXPECT_EQ(v.pool.stats().extensions, 1u);
  EXPECT_EQ(v.sim.counters().va_reserves, 2u);
  EXPECT_EQ(v.pool.check_invariants(), "");
  v.free(b);
  v.pool.release_cached();
  EXPECT_EQ(v.sim.reservations(), 0u) << "both parts of the extended range are freed";
}

TEST(VmmPool, WhenTheRangeAfterIsTakenFreeChunksMoveInstead) {
  VmmPoolOptions o;
  o.reserve = 0;
  Vmm v(4 * GiB, o);
  void* a = v.alloc(30 * MiB);
  void* keep = v.alloc(10 * MiB);  // reserved right after a's range
  ASSERT_NE(keep, nullptr);
  ASSERT_EQ(v.free(a, nullptr, true), CUDA_SUCCESS);
  void* b = v.alloc(50 * MiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(v.fig().reserved_bytes, 60 * MiB) << "30 moved + 20 new + the live 10";
  EXPECT_EQ(v.pool.stats().pieces_moved, 15u);
  EXPECT_EQ(v.sim.reservations(), 2u) << "the emptied range was freed";
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, PhysicalMemoryComesInChunksOrInRunsWhenConfigured) {
  Vmm v;
  ASSERT_NE(v.alloc(200 * MiB), nullptr);
  EXPECT_EQ(v.sim.counters().physical_creates, 100u) << "one handle per chunk: each can move alone";
  EXPECT_EQ(v.sim.counters().maps, 100u);
  VmmPoolOptions o;
  o.piece = 64 * MiB;
  Vmm runs(4 * GiB, o);
  ASSERT_NE(runs.alloc(200 * MiB), nullptr);
  EXPECT_EQ(runs.sim.counters().physical_creates, 4u) << "64+64+64+8";
  EXPECT_EQ(runs.sim.counters().maps, 4u);
  EXPECT_EQ(runs.pool.check_invariants(), "");
}

// ---- reuse safety (mirrors the caching policy's tests) ----

// Sizes that exercise each part: the arena (whole chunks), the medium and the small classes.
const std::vector<uint64_t> kClassSizes = {12 * MiB, 3 * MiB, 4096};

TEST(VmmPool, FreedMemoryIsNotReusedBeforeItsFenceCompletes) {
  for (uint64_t n : kClassSizes) {
    Vmm v;
    v.sim.set_events_complete_at_once(false);  // the device is still busy with earlier work
    void* a = v.alloc(n);
    ASSERT_EQ(v.free(a), CUDA_SUCCESS);
    // The block comes back only once its fence completed: here, where the device does not catch
    // up by itself, after the pool waited for that fence (not the device) rather than grow.
    bool reused = false;
    const int tries = static_cast<int>(std::min<uint64_t>(1024, 2 * GiB / n));
    for (int i = 0; i < tries && !reused; ++i) {
      const uint64_t waits = v.sim.counters().fence_waits;
      reused = v.alloc(n) == a;
      if (reused) {
        EXPECT_GT(v.sim.counters().fence_waits, waits) << n << ": reused before its fence completed";
      }
    }
    EXPECT_TRUE(reused) << n;
    EXPECT_GE(v.fig().reuse_waits, 1u);
    EXPECT_EQ(v.sim.counters().synchronizes, 0u) << n << ": without synchronizing the device";
    EXPECT_EQ(v.pool.check_invariants(), "");
  }
}

TEST(VmmPool, WaitsForTheOldestClosedEpochRatherThanCarve) {
  // As CachingPool's test of the same name: a block freed with cudaFree waits in a closed epoch
  // while the device catches up, and the next request could be carved from the free rest of its
  // chunks. The pool waits for that epoch's fence (the work before it, not the device) and
  // reuses the freed memory, as PyTorch's allocator would hand back a tensor's block; carving
  // around it made the pool fragment on a device running behind the host (the CPU corpus
  // replayed with plain frees under --gpu-time model: utilization 0.90-0.95, now 0.94-0.98).
  // GPUSHIM_VMM_REUSE=idle, the pool before, carves: y at x + 3 MiB, no wait.
  for (bool wait : {true, false}) {
    VmmPoolOptions o;
    o.wait_before_carve = wait;
    Vmm v(4 * GiB, o);
    v.sim.set_events_complete_at_once(false);
    void* x = v.alloc(3 * MiB);  // two chunks: 1 MiB free after it
    ASSERT_NE(x, nullptr);
    ASSERT_EQ(v.free(x), CUDA_SUCCESS);  // 3 MiB: an epoch of its own, closed
    void* y = v.alloc(512 * KiB);
    EXPECT_EQ(v.sim.counters().fence_waits, wait ? 1u : 0u);
    EXPECT_EQ(v.sim.counters().synchronizes, 0u);
    EXPECT_EQ(addr(y), wait ? addr(x) : addr(x) + 3 * MiB);
    EXPECT_EQ(v.fig().reserved_bytes, 4 * MiB);
    EXPECT_EQ(v.pool.check_invariants(), "");
  }
}

TEST(VmmPool, APoolDestroyedWithBorrowedChunksReleasesTheirEvents) {
  // Walls keep the event of the free they stand for (a review helper's reproducer: the
  // destructor deleted them without it, 50 events leaked). Only tests and replays destroy pools.
  SimBackend sim(4 * GiB);
  sim.set_events_complete_at_once(false);
  {
    VmmPool pool(sim, VmmPoolOptions{});
    std::vector<void*> blocks;
    for (int i = 0; i < 10; ++i) {
      void* p = nullptr;
      uint64_t got = 0;
      ASSERT_EQ(pool.allocate(AllocRequest{20 * MiB, vmm_stream(0x100), true}, &p, &got), CUDA_SUCCESS);
      blocks.push_back(p);
    }
    for (int i = 0; i < 10; i += 2) ASSERT_EQ(pool.deallocate(blocks[i], vmm_stream(0x100), true), CUDA_SUCCESS);
    void* big = nullptr;
    uint64_t got = 0;
    ASSERT_EQ(pool.allocate(AllocRequest{100 * MiB, vmm_stream(0x100), true}, &big, &got), CUDA_SUCCESS);
    ASSERT_EQ(pool.stats().borrows, 50u);
  }
  EXPECT_EQ(sim.live_events(), 0u);
}

TEST(VmmPool, FreedMemoryIsReusedWithoutSynchronizationOnceIdle) {
  Vmm v;
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(v.alloc(10 * MiB));
  for (int i = 0; i < 4; ++i) v.free(blocks[i]);
  EXPECT_EQ(v.fig().quarantined_bytes, 40 * MiB);
  void* c = v.alloc(40 * MiB);
  EXPECT_EQ(c, blocks[0]) << "the fence completed: the four merged blocks serve it";
  EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  EXPECT_EQ(v.fig().reuse_syncs, 0u);
  EXPECT_EQ(v.fig().reserved_bytes, 100 * MiB);
}

TEST(VmmPool, SynchronizesOnlyWhenMemoryIsShort) {
  Vmm v(4 * GiB, {}, /*limit=*/60 * MiB);
  v.sim.set_events_complete_at_once(false);
  void* a = v.alloc(40 * MiB, vmm_stream(0x100), true);
  v.free(a, vmm_stream(0x100), true);
  // 40 MiB freed on a stream whose work is still queued; 50 MiB asked elsewhere, 20 MiB left under
  // the cap: only a sync makes that memory idle, then the pool stitches it into the new block.
  EXPECT_NE(v.alloc(50 * MiB), nullptr);
  EXPECT_EQ(v.sim.counters().synchronizes, 1u);
  EXPECT_EQ(v.fig().reuse_syncs, 1u);
  EXPECT_LE(v.fig().reserved_bytes, 60 * MiB);
}

// A block freed in the order of a stream of another context (one the program made) waits for an
// event recorded there at the free; the pool's synchronization covers its own context only, so
// memory short, the request fails rather than take it (before 2026-11-27 it took it).
TEST(VmmPool, ABlockFreedInAnotherContextsOrderWaitsForItsOwnEventThroughASynchronization) {
  Vmm v(4 * GiB, {}, /*limit=*/60 * MiB);
  v.sim.set_events_complete_at_once(false);
  const CUstream theirs = vmm_stream(0x700);
  v.sim.set_foreign_stream(theirs);
  void* a = v.alloc(40 * MiB);
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(v.free(a, theirs, true), CUDA_SUCCESS);
  EXPECT_EQ(v.alloc(50 * MiB), nullptr);
  EXPECT_GE(v.sim.counters().synchronizes, 1u);
  v.sim.complete_events();  // that context's work is done
  EXPECT_NE(v.alloc(50 * MiB), nullptr);
  EXPECT_LE(v.fig().reserved_bytes, 60 * MiB);
}

TEST(VmmPool, StreamOrderedFreeIsReusableAtOnceOnTheSameStream) {
  for (uint64_t n : kClassSizes) {
    Vmm v;
    v.sim.set_events_complete_at_once(false);
    void* a = v.alloc(n, vmm_stream(0x100), true);
    v.free(a, vmm_stream(0x100), true);
    EXPECT_EQ(v.alloc(n, vmm_stream(0x100), true), a) << n;
    EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  }
}

TEST(VmmPool, StreamOrderedFreeWaitsForItsEventOnAnotherStream) {
  for (uint64_t n : kClassSizes) {
    Vmm v;
    v.sim.set_events_complete_at_once(false);
    void* a = v.alloc(n, vmm_stream(0x100), true);
    v.free(a, vmm_stream(0x100), true);
    void* b = v.alloc(n, vmm_stream(0x200), true);
    EXPECT_NE(b, a) << n << ": reused on another stream before the free's event completed";
    void* c = v.alloc(n);
    EXPECT_NE(c, a);
    v.sim.complete_events();
    EXPECT_EQ(v.alloc(n, vmm_stream(0x200), true), a) << n;
  }
}

TEST(VmmPool, StreamOrderedFreeJoinsIdleMemoryItsStreamFreedBefore) {
  // A block freed on a stream, its work still queued, beside idle memory the same stream freed
  // before: one block, so that best fit finds the pair for that stream (not the fresh rest of the
  // chunk), while another stream waits for the queued work. Fresh memory beside a stream-ordered
  // free stays apart (StreamOrderedFreeWaitsForItsEventOnAnotherStream).
  Vmm v;
  v.sim.set_events_complete_at_once(false);
  const CUstream s = vmm_stream(0x100);
  void* a = v.alloc(256 * KiB, s, true);
  void* b = v.alloc(256 * KiB, s, true);
  void* c = v.alloc(256 * KiB, s, true);  // keeps b apart from the rest of the chunk
  ASSERT_EQ(addr(b), addr(a) + 256 * KiB);
  ASSERT_EQ(addr(c), addr(b) + 256 * KiB);
  v.free(a, s, true);
  v.sim.complete_events();  // a is idle, freed last on s
  v.free(b, s, true);       // b's work is still queued
  EXPECT_NE(v.alloc(512 * KiB, vmm_stream(0x200), true), a) << "reused on another stream before b's event completed";
  const uint64_t maps = v.sim.counters().maps;
  EXPECT_EQ(v.alloc(512 * KiB, s, true), a);
  EXPECT_EQ(v.sim.counters().maps, maps);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, PerThreadDefaultStreamIsNeverTheSameStream) {
  for (uint64_t n : kClassSizes) {
    Vmm v;
    v.sim.set_events_complete_at_once(false);
    void* a = v.alloc(n, CU_STREAM_PER_THREAD, true);
    v.free(a, CU_STREAM_PER_THREAD, true);
    EXPECT_NE(v.alloc(n, CU_STREAM_PER_THREAD, true), a) << n;
  }
}

// A block freed on a stream whose work is still queued is that stream's to reuse where it lies,
// also as part of a larger block built around it (the stream runs the old work first): on a GPU,
// where the host runs ahead, most freed memory is in that state when the next tensor is made.
TEST(VmmPool, ABuildTakesInWhatItsOwnStreamFreedWhileTheWorkIsQueued) {
  for (bool stream_order : {true, false}) {
    VmmPoolOptions o;
    o.stream_order_builds = stream_order;
    Vmm v(4 * GiB, o);
    v.sim.set_events_complete_at_once(false);
    void* a = v.alloc(3 * MiB, vmm_stream(0x100), true);  // two chunks, the last 1 MiB of them free
    ASSERT_NE(a, nullptr);
    v.free(a, vmm_stream(0x100), true);
    // Nothing free holds 5 MiB: built where a lay, with one chunk more, or (idle builds only)
    // around it, from the idle 1 MiB after it and two new chunks.
    void* b = v.alloc(5 * MiB, vmm_stream(0x100), true);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b == a, stream_order);
    EXPECT_EQ(v.fig().reserved_bytes, stream_order ? 6 * MiB : 8 * MiB);
    EXPECT_EQ(v.sim.counters().unmaps, 0u) << "memory still queued is never unmapped";
    EXPECT_EQ(v.pool.check_invariants(), "");
  }
}

TEST(VmmPool, ABuildForAnotherStreamGoesAroundMemoryStillQueued) {
  Vmm v;
  v.sim.set_events_complete_at_once(false);
  void* a = v.alloc(3 * MiB, vmm_stream(0x100), true);
  v.free(a, vmm_stream(0x100), true);
  for (auto [stream, ordered] : {std::pair{vmm_stream(0x200), true}, std::pair{vmm_stream(0x100), false}}) {
    void* b = v.alloc(5 * MiB, stream, ordered);
    ASSERT_NE(b, nullptr);
    EXPECT_TRUE(addr(b) >= addr(a) + 3 * MiB || addr(b) + 5 * MiB <= addr(a)) << "built over a's queued memory";
    for (auto [h, off] : backing(v.sim, addr(b), 5 * MiB))
      EXPECT_NE(std::pair(h, off), backing(v.sim, addr(a), 1).front()) << "a's memory mapped under b";
    v.free(b, stream, ordered);
  }
  EXPECT_EQ(v.pool.check_invariants(), "");
  // Once the work is done, anyone may build over it: 11 MiB fit in what the pool holds.
  const uint64_t reserved = v.fig().reserved_bytes;
  v.sim.complete_events();
  EXPECT_NE(v.alloc(reserved - 1 * MiB, vmm_stream(0x200), true), nullptr);
  EXPECT_EQ(v.fig().reserved_bytes, reserved);
}

// A chunk end freed on s (work still queued) is lent to a build for s that then cannot get its
// other chunk (the device is full; a capture elsewhere forbids the retry's synchronization): the
// lend is undone, and the end must come back on s's terms, not ready for anyone (a review
// helper's reproducer).
TEST(VmmPool, AnUndoneLendGivesBackMemoryOnItsStreamsTerms) {
  for (bool stream_order : {true, false}) {
    VmmPoolOptions o;
    o.stream_order_builds = stream_order;
    Vmm v(4 * GiB, o);
    v.sim.set_events_complete_at_once(false);
    const CUstream s = vmm_stream(0x100), t = vmm_stream(0x200);
    void* x = v.alloc(1 * MiB, s, true);
    void* l = v.alloc(1 * MiB, s, true);
    ASSERT_EQ(addr(l), addr(x) + 1 * MiB) << "x and l share a chunk";
    v.free(x, s, true);
    v.sim.set_capturing(true);
    v.sim.fail_next(100);
    EXPECT_EQ(v.alloc(3 * MiB, s, true), nullptr);
    v.sim.fail_next(0);
    EXPECT_EQ(v.pool.check_invariants(), "");
    void* y = v.alloc(1 * MiB, t, true);
    ASSERT_NE(y, nullptr);
    EXPECT_NE(addr(y), addr(x)) << "another stream got memory s's queued work still uses";
    void* z = v.alloc(512 * KiB, nullptr, false);
    ASSERT_NE(z, nullptr);
    EXPECT_FALSE(addr(z) >= addr(x) && addr(z) < addr(x) + 1 * MiB) << "a plain cudaMalloc got s's queued memory";
  }
}

// GPUSHIM_VMM_REUSE=idle is the pool that recorded the GPU traces: a size that outlives troughs
// still takes the top of a window of idle blocks (merged whole, then split from the top).
TEST(VmmPool, IdleOnlyBuildsPlaceLongLivedSizesAtTheTopOfTheWindow) {
  VmmPoolOptions o;
  o.stream_order_builds = false;
  Vmm v(4 * GiB, o);
  const CUstream s = vmm_stream(0x100), t = vmm_stream(0x200);
  // 4 MiB blocks outlive troughs: one vote.
  void* big = v.alloc(20 * MiB);
  void* a = v.alloc(4 * MiB);
  v.free(big);
  void* c = v.alloc(20 * MiB);
  v.free(a);
  v.free(c);
  v.pool.release_cached();
  v.sim.set_events_complete_at_once(false);
  void* f1 = v.alloc(3 * MiB, s, true);
  void* f2 = v.alloc(3 * MiB, s, true);
  ASSERT_NE(v.alloc(2 * MiB, s, true), nullptr);
  v.free(f1, s, true);
  v.free(f2, t, true);  // not merged with f1: different streams, neither done
  v.sim.complete_events();
  v.sim.set_events_complete_at_once(true);
  void* b = v.alloc(4 * MiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(addr(b), addr(f2) + 3 * MiB - 4 * MiB);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, StitchingNeverMovesMemoryStillInUseByAStream) {
  Vmm v;
  v.sim.set_events_complete_at_once(false);
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(v.alloc(20 * MiB, vmm_stream(0x100), true));
  for (int i = 0; i < 10; i += 2) v.free(blocks[i], vmm_stream(0x100), true);
  // Same stream: each block could be reused in place, but unmapping it while its work may still
  // run is not safe on every driver, so nothing moves. Its chunks are mapped a second time under
  // the new block instead (borrowed: the old addresses stay walls until the new block is idle
  // and free), so the pool does not grow; idle-only builds grow it.
  void* big = v.alloc(100 * MiB, vmm_stream(0x100), true);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(v.sim.counters().unmaps, 0u);
  EXPECT_EQ(v.fig().reserved_bytes, 200 * MiB);
  EXPECT_EQ(v.pool.stats().borrows, 50u);
  // Once the freed blocks' work is done, the next build moves the borrowed chunks for good: the
  // old addresses are unmapped, and the new block's memory stays where it is.
  const auto before = backing(v.sim, addr(big), 100 * MiB);
  v.sim.complete_events();
  ASSERT_NE(v.alloc(30 * MiB, vmm_stream(0x100), true), nullptr);
  EXPECT_EQ(v.sim.counters().unmaps, 50u);
  EXPECT_EQ(backing(v.sim, addr(big), 100 * MiB), before);
  EXPECT_EQ(v.pool.check_invariants(), "");
  v.free(big, nullptr, true);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, NeverSynchronizesQueriesOrUnmapsDuringCapture) {
  VmmPoolOptions o;
  o.quarantine_bytes = 0;
  Vmm v(64 * MiB, o);
  v.sim.set_events_complete_at_once(false);
  void* a = v.alloc(30 * MiB);
  void* s = v.alloc(3 * MiB, vmm_stream(0x100), true);
  void* small = v.alloc(4096, vmm_stream(0x100), true);
  v.free(a);
  v.free(s, vmm_stream(0x100), true);
  v.free(small, vmm_stream(0x100), true);
  const SimCounters before = v.sim.counters();
  v.sim.set_capturing(true);
  // 36 MiB held of 64: during capture the pool must fail rather than sync, query or unmap.
  EXPECT_EQ(v.alloc(40 * MiB), nullptr);
  EXPECT_NE(v.alloc(4096, vmm_stream(0x200), true), nullptr);
  v.pool.release_cached();
  EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  EXPECT_EQ(v.sim.counters().event_queries, before.event_queries);
  EXPECT_EQ(v.sim.counters().unmaps, 0u);
  v.sim.set_capturing(false);
  EXPECT_NE(v.alloc(40 * MiB), nullptr);
  EXPECT_GE(v.sim.counters().synchronizes + v.sim.counters().fence_waits, 1u);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

// ---- cap and out of memory ----

TEST(VmmPool, FitsInTotalFreeMemoryUnderTheCapWithoutAContiguousRange) {
  VmmPoolOptions o;
  Vmm v(4 * GiB, o, /*limit=*/200 * MiB);
  v.sim.set_events_complete_at_once(false);  // the cudaFree'd blocks stay busy: the device lags
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(v.alloc(20 * MiB));
  for (int i = 0; i < 10; i += 2) v.free(blocks[i]);  // plain cudaFree: waiting for their fence
  void* big = v.alloc(100 * MiB);
  ASSERT_NE(big, nullptr) << "fits in the freed memory once its fences are waited for and it is remapped";
  const PoolFigures f = v.fig();
  EXPECT_EQ(f.ooms, 0u);
  EXPECT_EQ(v.budget.held(), 200 * MiB);
  EXPECT_GE(f.reuse_waits, 1u);
  EXPECT_EQ(v.sim.counters().synchronizes, 0u) << "the work before the frees, not the device";
  EXPECT_EQ(v.pool.check_invariants(), "");
}

// A request the device (or the cap) cannot hold is refused before any piece is made: made one by
// one, the pieces took every free byte of a 16 GiB device before the last failed (267 ms, the
// device full meanwhile for every other process). CUDA refuses such a cuMemAlloc at once.
TEST(VmmPool, ARequestLargerThanTheDeviceCanHoldTakesNothingBeforeItIsRefused) {
  for (const uint64_t limit : {uint64_t{0}, 1 * GiB}) {
    SCOPED_TRACE(limit == 0 ? "no cap" : "a 1 GiB cap");
    Vmm v(4 * GiB, {}, limit);
    void* held = v.alloc(512 * MiB);
    ASSERT_NE(held, nullptr);
    const SimCounters before = v.sim.counters();
    EXPECT_EQ(v.alloc(limit == 0 ? 4 * GiB : 600 * MiB), nullptr);
    EXPECT_EQ(v.sim.counters().physical_creates, before.physical_creates) << "no piece made";
    EXPECT_EQ(v.sim.counters().maps, before.maps);
    EXPECT_EQ(v.sim.peak_used(), 512 * MiB) << "the device never held more than the live block";
    EXPECT_EQ(v.fig().ooms, 1u);
    EXPECT_EQ(v.pool.check_invariants(), "");
    // What fits is still served, from new pieces.
    EXPECT_NE(v.alloc(limit == 0 ? 3 * GiB : 500 * MiB), nullptr);
  }
}

TEST(VmmPool, OutOfMemoryWhenFreeMemoryCannotCoverTheRequest) {
  Vmm v(4 * GiB, {}, /*limit=*/100 * MiB);
  void* a = v.alloc(60 * MiB);
  void* b = v.alloc(30 * MiB);
  ASSERT_NE(b, nullptr);
  v.free(a, nullptr, true);
  EXPECT_EQ(v.alloc(80 * MiB), nullptr) << "70 MiB could be had, not 80";
  EXPECT_EQ(v.fig().ooms, 1u);
  EXPECT_EQ(v.fig().alloc_retries, 1u);
  EXPECT_EQ(v.pool.check_invariants(), "");
  EXPECT_NE(v.alloc(70 * MiB), nullptr) << "the failed attempt left the pool usable";
  EXPECT_EQ(v.budget.held(), 100 * MiB);
}

TEST(VmmPool, OutOfMemoryTakesBackEmptySmallSegments) {
  Vmm v(4 * GiB, {}, /*limit=*/64 * MiB);
  std::vector<void*> small;
  for (int i = 0; i < 120; ++i) small.push_back(v.alloc(512 << 10));  // 30 segments, 60 MiB
  for (void* p : small) ASSERT_NE(p, nullptr);
  for (void* p : small) v.free(p);
  void* big = v.alloc(60 * MiB);
  ASSERT_NE(big, nullptr) << "the small pool's empty chunks are remapped for the large request";
  EXPECT_LE(v.budget.held(), 64 * MiB);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, InjectedDriverFailureIsReturnedAndThePoolRecovers) {
  Vmm v;
  v.sim.fail_next(2);  // the first try and the retry
  EXPECT_EQ(v.alloc(5 * MiB), nullptr);
  EXPECT_EQ(v.pool.check_invariants(), "");
  EXPECT_NE(v.alloc(5 * MiB), nullptr);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, EmptySubAllocatorSegmentsAreRemappedBeforeThePoolGrows) {
  // 3 MiB requests live in 8 MiB medium segments. Once all are freed, a large request reuses
  // those chunks rather than creating memory beside them, without a sync: the blocks freed on
  // the stream merge with their segments' free tails once their events have completed, asked
  // before anything grows.
  Vmm v(4 * GiB, classic());
  std::vector<void*> medium;
  for (int i = 0; i < 20; ++i) medium.push_back(v.alloc(3 * MiB, vmm_stream(0x100), true));
  const uint64_t held = v.sim.used();
  EXPECT_EQ(held, 62 * MiB) << "medium segments grow in place: 60 MiB in few segments";
  for (void* p : medium) v.free(p, vmm_stream(0x100), true);
  ASSERT_NE(v.alloc(held), nullptr);
  EXPECT_EQ(v.sim.used(), held) << "the empty segments became the large block";
  EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, EmptySegmentsOfOneSizeClassServeTheOtherBeforeThePoolGrows) {
  // Medium requests fill a medium segment and are freed; then small requests need segments. The
  // sub-allocator hands its idle empty medium segments back to the arena before asking it for
  // more, so the small segments are made of those chunks: nothing new is created, and nothing
  // is synchronized (cudaFree'd memory is idle once its fence completes, asked without waiting).
  Vmm v(4 * GiB, classic());
  std::vector<void*> medium;
  for (int i = 0; i < 8; ++i) medium.push_back(v.alloc(3 * MiB));
  const uint64_t held = v.sim.used();
  EXPECT_EQ(held, 26 * MiB) << "8 MiB, grown in place by 2 MiB chunks";
  for (void* p : medium) v.free(p);
  v.sim.complete_events();
  std::vector<void*> small;
  for (int i = 0; i < 48; ++i) small.push_back(v.alloc(512 << 10));  // 24 MiB: 6 small segments
  for (void* p : small) ASSERT_NE(p, nullptr);
  EXPECT_EQ(v.sim.used(), held) << "the empty medium segments became small ones";
  EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, MediumSegmentGrowsIntoItsFreeTailAndGivesTheTailBack) {
  // 3 MiB and 3.5 MiB blocks leave a 1.5 MiB free tail in their 8 MiB segment. A 5 MiB request
  // grows that segment in place by the 4 MiB the tail lacks (as PyTorch's expandable segments
  // grow), instead of making a second 8 MiB segment whose space could never merge with the first.
  Vmm v(4 * GiB, classic());
  void* a = v.alloc(3 * MiB);
  void* b = v.alloc(3 * MiB + MiB / 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(v.sim.used(), 8 * MiB);
  void* c = v.alloc(5 * MiB);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(addr(c), addr(a) + 6 * MiB + MiB / 2) << "the tail, grown in place";
  EXPECT_EQ(v.sim.used(), 12 * MiB);
  EXPECT_EQ(v.pool.check_invariants(), "");
  // Freed, [6.5, 12) MiB is the segment's free tail: before the sub-allocator asks the arena for
  // more (a small segment here), its whole chunks go back ([8, 12)) and become that segment.
  v.free(c);
  v.sim.complete_events();
  std::vector<void*> small;
  for (int i = 0; i < 8; ++i) small.push_back(v.alloc(512 << 10));  // one 4 MiB small segment
  for (void* p : small) ASSERT_NE(p, nullptr);
  EXPECT_EQ(v.sim.used(), 12 * MiB) << "the tail's chunks became the small segment";
  EXPECT_EQ(v.sim.counters().synchronizes, 0u);
  EXPECT_EQ(v.pool.check_invariants(), "");
  for (void* p : small) v.free(p);
  v.free(a);
  v.free(b);
  v.pool.release_cached();
  EXPECT_EQ(v.sim.used(), 0u) << "grown and shrunk segments still go back whole";
  EXPECT_EQ(v.pool.check_invariants(), "");
}

// SimBackend is single-threaded; the shim's backends are not. Serializes it for the test below.
class LockedBackend final : public Backend {
  template <typename F>
  auto locked(F f) -> decltype(f()) {
    std::lock_guard<std::mutex> lock(mu_);
    return f();
  }

 public:
  explicit LockedBackend(Backend& up) : up_(up) {}
  CUresult segment_alloc(size_t n, void** out) override { return locked([&] { return up_.segment_alloc(n, out); }); }
  CUresult segment_free(void* p, size_t n) override { return locked([&] { return up_.segment_free(p, n); }); }
  CUresult synchronize() override { return locked([&] { return up_.synchronize(); }); }
  uint64_t record_event(CUstream s) override { return locked([&] { return up_.record_event(s); }); }
  bool event_done(uint64_t e) override { return locked([&] { return up_.event_done(e); }); }
  void release_event(uint64_t e) override { locked([&] { up_.release_event(e); return 0; }); }
  bool capture_active() override { return locked([&] { return up_.capture_active(); }); }
  CUresult mem_info(size_t* f, size_t* t) override { return locked([&] { return up_.mem_info(f, t); }); }
  size_t granularity() override { return locked([&] { return up_.granularity(); }); }
  CUresult va_reserve(size_t n, uintptr_t h, uintptr_t* out) override { return locked([&] { return up_.va_reserve(n, h, out); }); }
  CUresult va_free(uintptr_t va, size_t n) override { return locked([&] { return up_.va_free(va, n); }); }
  CUresult physical_create(size_t n, uint64_t* h) override { return locked([&] { return up_.physical_create(n, h); }); }
  CUresult physical_release(uint64_t h, size_t n) override { return locked([&] { return up_.physical_release(h, n); }); }
  CUresult map(uintptr_t va, size_t n, uint64_t h, size_t off) override { return locked([&] { return up_.map(va, n, h, off); }); }
  CUresult unmap(uintptr_t va, size_t n) override { return locked([&] { return up_.unmap(va, n); }); }

 private:
  Backend& up_;
  std::mutex mu_;
};

TEST(VmmPool, ConcurrentSmallMediumAndLargeRequestsUnderACap) {
  // Four threads, every size class, a cap tight enough to take the retry path (which calls the
  // sub-allocator from the large path) while other threads call the arena from the sub-allocator.
  SimBackend sim(64 * GiB);
  LockedBackend locked(sim);
  DeviceBudget budget;
  budget.set_limit(512 * MiB);
  LimitedBackend limited(locked, budget);
  VmmPool pool(limited, VmmPoolOptions{});
  std::vector<std::thread> threads;
  std::atomic<uint64_t> ok{0}, failed{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<std::pair<void*, bool>> live;
      for (int i = 0; i < 3000; ++i) {
        if (!live.empty() && (live.size() > 40 || rng() % 2)) {
          const size_t k = rng() % live.size();
          const bool ordered = live[k].second;
          ASSERT_EQ(pool.deallocate(live[k].first, ordered ? vmm_stream(0x100 + t) : nullptr, ordered), CUDA_SUCCESS);
          live[k] = live.back();
          live.pop_back();
          continue;
        }
        const uint64_t n = rng() % 3 == 0 ? 9 * MiB + rng() % (40 * MiB) : 1 + rng() % (8 * MiB);
        const bool ordered = rng() % 2;
        void* p = nullptr;
        uint64_t got = 0;
        if (pool.allocate(AllocRequest{n, ordered ? vmm_stream(0x100 + t) : nullptr, ordered}, &p, &got) == CUDA_SUCCESS) {
          live.emplace_back(p, ordered);
          ++ok;
        } else {
          ++failed;
        }
      }
      for (auto& [p, ordered] : live) pool.deallocate(p, ordered ? vmm_stream(0x100 + t) : nullptr, ordered);
    });
  }
  for (auto& th : threads) th.join();
  // Demand (four threads, up to 40 live blocks each) is well over the cap: refusals are expected,
  // their number depends on the interleaving. What matters: no deadlock, no overdraft, no leak.
  EXPECT_GT(ok.load(), 3000u);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_LE(budget.peak(), 512 * MiB);
  pool.release_cached();
  EXPECT_EQ(sim.used(), 0u);
  EXPECT_EQ(budget.held(), 0u);
  std::printf("concurrent: %llu allocations, %llu refused under the 512 MiB cap\n", (unsigned long long)ok.load(),
              (unsigned long long)failed.load());
}

// ---- lending the free ends of partly used chunks ----

// A chunk whose free tail is walled in by a live block (a) serves the head of a larger block
// placed elsewhere, through a second mapping of the same memory.
TEST(VmmPool, APartlyUsedChunksFreeTailServesANewBlocksHead) {
  Vmm v;
  void* a = v.alloc(512 << 10);
  void* f = v.alloc(1536 << 10);
  void* c = v.alloc(2 * MiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(f, nullptr);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(addr(f), addr(a) + (512 << 10));
  const auto tail = backing(v.sim, addr(f), 1536 << 10);
  EXPECT_EQ(v.sim.used(), 4 * MiB);
  ASSERT_EQ(v.free(f), CUDA_SUCCESS);
  v.sim.complete_events();
  // 3 MiB fits in no free block: 1.5 MiB of it comes from the freed tail, 1.5 MiB is new.
  void* big = v.alloc(3 * MiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(v.sim.used(), 6 * MiB) << "one new chunk, not two";
  EXPECT_EQ(v.pool.stats().aliases, 1u);
  EXPECT_EQ(backing(v.sim, addr(big), 1536 << 10).front(), tail.front()) << "the block starts on the lent memory";
  EXPECT_EQ(v.pool.check_invariants(), "");
  // The lent range is not free where it lies: a block that would fit there goes elsewhere.
  void* d = v.alloc(1536 << 10);
  ASSERT_NE(d, nullptr);
  EXPECT_NE(addr(d), addr(f));
  uint64_t h1 = 0, o1 = 0, h2 = 0, o2 = 0;
  ASSERT_TRUE(v.sim.translate(addr(big), &h1, &o1));
  ASSERT_TRUE(v.sim.translate(addr(d), &h2, &o2));
  EXPECT_FALSE(h1 == h2 && o2 < (2 * MiB) && o1 < o2 + (1536 << 10)) << "no two live blocks on the same memory";
  // Once the block is freed and idle, the second mapping goes and the tail is free where it was.
  ASSERT_EQ(v.free(big), CUDA_SUCCESS);
  ASSERT_EQ(v.free(d), CUDA_SUCCESS);
  v.pool.release_cached();
  EXPECT_EQ(v.pool.check_invariants(), "");
  EXPECT_EQ(v.sim.used(), 4 * MiB) << "a's and c's chunks";
  void* again = v.alloc(1536 << 10);
  EXPECT_EQ(addr(again), addr(f)) << "the returned tail serves a block that fits it";
  EXPECT_EQ(v.sim.used(), 4 * MiB);
  EXPECT_EQ(v.sim.counters().synchronizes, 1u) << "release_cached's own, no other";
}

// The mirror case: a chunk's free head, walled in by a live block after it, serves a block's tail.
TEST(VmmPool, APartlyUsedChunksFreeHeadServesANewBlocksTail) {
  Vmm v;
  void* f = v.alloc(1536 << 10);
  void* a = v.alloc(512 << 10);
  void* c = v.alloc(2 * MiB);
  ASSERT_NE(f, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(c, nullptr);
  const auto head = backing(v.sim, addr(f), 1536 << 10);
  ASSERT_EQ(v.free(f), CUDA_SUCCESS);
  v.sim.complete_events();
  void* big = v.alloc(3 * MiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(v.sim.used(), 6 * MiB) << "one new chunk, not two";
  EXPECT_EQ(v.pool.stats().aliases, 1u);
  uint64_t h = 0, off = 0;
  ASSERT_TRUE(v.sim.translate(addr(big) + 3 * MiB - 1, &h, &off));
  EXPECT_EQ(h, head.front().first) << "the block ends on the lent memory";
  EXPECT_EQ(off, 1 * MiB - 1);
  EXPECT_EQ(v.pool.check_invariants(), "");
}

// Without lending, the same sequence creates two chunks (the option is what makes the difference).
TEST(VmmPool, WithoutLendingAWalledInTailStaysUnused) {
  VmmPoolOptions o;
  o.alias_tails = false;
  Vmm v(4 * GiB, o);
  void* a = v.alloc(512 << 10);
  void* f = v.alloc(1536 << 10);
  ASSERT_NE(v.alloc(2 * MiB), nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(v.free(f), CUDA_SUCCESS);
  v.sim.complete_events();
  ASSERT_NE(v.alloc(3 * MiB), nullptr);
  EXPECT_EQ(v.sim.used(), 8 * MiB);
  EXPECT_EQ(v.pool.stats().aliases, 0u);
}

// ---- configuration ----

TEST(VmmPool, ConfigSelectsTheVmmPolicyAndFallsBackWithoutVirtualMemory) {
  const ConfigResult r = parse_config({{"GPUSHIM_POLICY", " VMM "}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.config.policy, PolicyKind::kVmm);
  SimBackend sim(GiB);
  auto pool = make_pool(r.config, sim);
  ASSERT_NE(dynamic_cast<VmmPool*>(pool.get()), nullptr);
  SimBackend no_vmm(GiB, /*granularity=*/0);
  set_log_enabled(false);
  auto fallback = make_pool(r.config, no_vmm);
  set_log_enabled(true);
  EXPECT_NE(dynamic_cast<CachingPool*>(fallback.get()), nullptr);
  const ConfigResult bad = parse_config({{"GPUSHIM_POLICY", "fastest"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.errors[0].message().find("vmm"), std::string::npos);
}

}  // namespace
}  // namespace gpushim
