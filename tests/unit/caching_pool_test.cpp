#include "policy/caching_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "policy/sim_backend.h"
#include "test_sizes.h"

namespace gpushim {
namespace {

CUstream stream_handle(uintptr_t v) { return reinterpret_cast<CUstream>(v); }

struct PoolUnderTest {
  explicit PoolUnderTest(uint64_t capacity = 1024 * MiB, CachingPoolOptions o = {}) : sim(capacity), pool(sim, o) {}
  void* alloc(size_t n, CUstream s = nullptr, bool ordered = false, uint64_t* got = nullptr) {
    void* p = nullptr;
    uint64_t a = 0;
    const CUresult r = pool.allocate(AllocRequest{n, s, ordered}, &p, &a);
    if (got) *got = a;
    return r == CUDA_SUCCESS ? p : nullptr;
  }
  PoolFigures fig() const {
    PoolFigures f;
    pool.figures(&f);
    return f;
  }
  SimBackend sim;
  CachingPool pool;
};

TEST(CachingPool, RoundsToGranularityAndCarvesSmallRequestsFromSmallSegments) {
  PoolUnderTest p;
  uint64_t got = 0;
  void* a = p.alloc(1, nullptr, false, &got);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(got, 512u);
  EXPECT_EQ(p.fig().reserved_bytes, 2 * MiB);
  void* b = p.alloc(4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b), reinterpret_cast<uintptr_t>(a) + 512);
  EXPECT_EQ(p.sim.counters().segment_allocs, 1u);
}

TEST(CachingPool, SmallRequestNeverSplitsALargeSegment) {
  PoolUnderTest p;
  void* big = p.alloc(1024 * MiB - 64 * MiB);
  ASSERT_NE(big, nullptr);
  ASSERT_EQ(p.pool.deallocate(big, nullptr, true), CUDA_SUCCESS);  // free and ready on the legacy stream
  void* small = p.alloc(4096);
  ASSERT_NE(small, nullptr);
  EXPECT_FALSE(reinterpret_cast<uintptr_t>(small) >= reinterpret_cast<uintptr_t>(big) &&
               reinterpret_cast<uintptr_t>(small) < reinterpret_cast<uintptr_t>(big) + 960 * MiB);
}

// Allocations carve the front of a free block, shrinking it inside the free set when that keeps
// the set's order and erasing and re-inserting it when not: best fit must hold either way, and
// the blocks must still merge back into whole segments.
TEST(CachingPool, CarvingKeepsBestFitAndMergesBack) {
  constexpr uint64_t KiB = 1024;
  PoolUnderTest p;
  auto at = [](void* q) { return reinterpret_cast<uintptr_t>(q); };
  auto alloc = [&](uint64_t n) { return p.alloc(n, nullptr, true); };  // stream-ordered: reusable at once
  auto free_now = [&](void* q) { ASSERT_EQ(p.pool.deallocate(q, nullptr, true), CUDA_SUCCESS); };
  void* a1 = alloc(64 * KiB);
  void* a2 = alloc(4 * KiB);  // keeps a1's and a3's blocks apart when freed
  void* a3 = alloc(256 * KiB);
  void* a4 = alloc(4 * KiB);
  ASSERT_TRUE(a1 && a2 && a3 && a4);
  const uintptr_t rest_start = at(a4) + 4 * KiB;
  free_now(a1);
  free_now(a3);
  // Free: 64 KiB at a1, 256 KiB at a3, the segment's remainder. The 256 KiB block fits best, and
  // what it leaves (32 KiB) sorts before the 64 KiB block: it has to move in the set.
  void* b = alloc(224 * KiB);
  EXPECT_EQ(at(b), at(a3));
  void* c = alloc(48 * KiB);  // best fit: the 64 KiB block, not the 32 KiB rest nor the remainder
  EXPECT_EQ(at(c), at(a1));
  void* d = alloc(16 * KiB);  // best fit: the 16 KiB left of the 64 KiB block
  EXPECT_EQ(at(d), at(a1) + 48 * KiB);
  void* e = alloc(100 * KiB);  // only the segment's remainder fits: shrunk in place
  EXPECT_EQ(at(e), rest_start);
  void* f = alloc(20 * KiB);  // best fit: the 32 KiB left of the 256 KiB block
  EXPECT_EQ(at(f), at(a3) + 224 * KiB);
  EXPECT_EQ(p.fig().largest_free_block, 2 * MiB - (rest_start - at(a1)) - 100 * KiB);
  for (void* q : {a2, a4, b, c, d, e, f}) free_now(q);
  EXPECT_EQ(p.sim.counters().segment_allocs, 1u);
  // After a synchronization every block merges back into the whole segment, which goes back.
  p.pool.release_cached();
  EXPECT_EQ(p.fig().reserved_bytes, 0u) << "the blocks no longer merge into the whole segment";
}

// cudaMemPoolTrimTo on the default pool: cached segments go back until fewer than `keep` bytes
// are reserved; live ones stay.
TEST(CachingPool, TrimToReleasesCachedSegmentsDownToTheRequestedSize) {
  PoolUnderTest p;
  void* seg[4];
  for (void*& q : seg) ASSERT_NE(q = p.alloc(20 * MiB, nullptr, true), nullptr);  // one segment each
  void* live = p.alloc(20 * MiB, nullptr, true);
  ASSERT_NE(live, nullptr);
  for (void* q : seg) ASSERT_EQ(p.pool.deallocate(q, nullptr, true), CUDA_SUCCESS);
  EXPECT_EQ(p.fig().reserved_bytes, 100 * MiB);
  p.pool.trim_to(200 * MiB);  // already fewer: nothing to do
  EXPECT_EQ(p.fig().reserved_bytes, 100 * MiB);
  p.pool.trim_to(50 * MiB);  // 100 -> 80 -> 60 -> 40: stops as soon as fewer than 50 are held
  EXPECT_EQ(p.fig().reserved_bytes, 40 * MiB);
  p.pool.trim_to(0);  // everything cached; the live block's segment stays
  EXPECT_EQ(p.fig().reserved_bytes, 20 * MiB);
  ASSERT_EQ(p.pool.deallocate(live, nullptr, true), CUDA_SUCCESS);
  p.pool.trim_to(0);
  EXPECT_EQ(p.fig().reserved_bytes, 0u);
}

// Repeated requests of one size skip the B-tree descent while the free sets have not changed
// (CachingPool::first_fit_candidate). Best fit must hold through everything that changes them or
// shrinks the remembered block.
TEST(CachingPool, RepeatedSizesKeepBestFit) {
  PoolUnderTest p;
  auto at = [](void* q) { return reinterpret_cast<uintptr_t>(q); };
  auto alloc = [&](uint64_t n) { return p.alloc(n, nullptr, true); };  // stream-ordered: reusable at once
  auto free_now = [&](void* q) { ASSERT_EQ(p.pool.deallocate(q, nullptr, true), CUDA_SUCCESS); };
  // Same size three times from the segment's remainder: consecutive.
  void* x1 = alloc(4096);
  void* x2 = alloc(4096);
  void* x3 = alloc(4096);
  ASSERT_TRUE(x1 && x2 && x3);
  EXPECT_EQ(at(x2), at(x1) + 4096);
  EXPECT_EQ(at(x3), at(x2) + 4096);
  // A freed block between live ones now fits best: the remembered answer is stale.
  free_now(x2);
  EXPECT_EQ(at(alloc(4096)), at(x2));
  EXPECT_EQ(at(alloc(4096)), at(x3) + 4096);
  // The remembered block shrinks below the size: the next request of that size goes elsewhere.
  void* f = alloc(1536);
  void* sep = alloc(512);  // keeps f's block apart from the remainder
  free_now(f);
  void* q1 = alloc(1024);  // best fit: f's 1536, which keeps its last 512 bytes
  EXPECT_EQ(at(q1), at(f));
  void* q2 = alloc(1024);  // those 512 bytes are too small now: the remainder
  EXPECT_EQ(at(q2), at(sep) + 512);
  void* q3 = alloc(512);  // and they still fit best for 512
  EXPECT_EQ(at(q3), at(f) + 1024);
  EXPECT_EQ(p.sim.counters().segment_allocs, 1u);
}

TEST(CachingPool, SegmentSizesPerClass) {
  PoolUnderTest p;
  p.alloc(11 * MiB);  // large: a segment of its own, rounded to 2 MiB
  EXPECT_EQ(p.fig().reserved_bytes, 12 * MiB);
  p.alloc(2 * MiB);  // medium: a 20 MiB segment
  EXPECT_EQ(p.fig().reserved_bytes, 32 * MiB);
  p.alloc(3 * MiB);  // fits in what is left of the 20 MiB segment
  EXPECT_EQ(p.fig().reserved_bytes, 32 * MiB);
}

TEST(CachingPool, FreedMemoryIsNotReusedBeforeItsFenceCompletes) {
  // An epoch larger than the free keeps it open until the miss below closes it (a closed epoch
  // is waited for before carving: WaitsForTheOldestClosedEpochRatherThanCarve).
  CachingPoolOptions o;
  o.quarantine_bytes = 64 * MiB;
  PoolUnderTest p(1024 * MiB, o);
  p.sim.set_events_complete_at_once(false);  // the device is still busy with earlier work
  void* a = p.alloc(12 * MiB);               // a segment of its own
  ASSERT_EQ(p.pool.deallocate(a, nullptr, false), CUDA_SUCCESS);
  void* b = p.alloc(14 * MiB);  // more than was freed: the pool grows, it does not wait
  EXPECT_NE(a, b) << "a cudaFree'd block was handed out again before the work issued before the free";
  EXPECT_EQ(p.fig().quarantined_bytes, 12 * MiB);
  p.sim.complete_events();  // the device caught up with the fence recorded at that miss
  EXPECT_EQ(p.alloc(12 * MiB), a) << "reused once its fence completed";
  EXPECT_EQ(p.sim.counters().synchronizes, 0u) << "without ever waiting for the device";
  EXPECT_EQ(p.sim.counters().fence_waits, 0u);
  EXPECT_EQ(p.fig().quarantined_bytes, 0u);
}

TEST(CachingPool, WaitsForTheOldestEpochRatherThanGrow) {
  // The program runs ahead of the device: what it freed could serve its next request. The pool
  // waits for the work before those frees (one fence), not for the whole device, and holds no more.
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(12 * MiB);
  p.pool.deallocate(a, nullptr, false);
  EXPECT_EQ(p.alloc(12 * MiB), a);
  EXPECT_EQ(p.sim.counters().fence_waits, 1u);
  EXPECT_EQ(p.fig().reuse_waits, 1u);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
  EXPECT_EQ(p.fig().reserved_bytes, 12 * MiB);
}

TEST(CachingPool, WaitsForTheOldestClosedEpochRatherThanCarve) {
  // A block freed with cudaFree waits in a closed epoch while the device catches up; the next
  // request of its size would fit the segment's free rest. The pool waits for that epoch's fence
  // (the work before it, not the device) and hands the freed block back, as PyTorch's allocator
  // would, rather than carve around it (before: the rest was carved, and on a device running
  // behind the host the pool fragmented and grew: 1.03-1.14x PyTorch's peak on the CPU corpus).
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* x = p.alloc(4 * MiB);  // from a 20 MiB segment
  void* guard = p.alloc(4 * MiB);
  ASSERT_NE(guard, nullptr);
  ASSERT_EQ(p.pool.deallocate(x, nullptr, false), CUDA_SUCCESS);  // 4 MiB: an epoch of its own, closed
  EXPECT_EQ(p.alloc(4 * MiB), x);
  EXPECT_EQ(p.sim.counters().fence_waits, 1u);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
  EXPECT_EQ(p.fig().reserved_bytes, 20 * MiB);
  // A free block of the request's very size needs no wait. The segment, full: x, guard, y, z, g.
  void* y = p.alloc(2 * MiB);
  void* z = p.alloc(8 * MiB);
  ASSERT_NE(p.alloc(2 * MiB), nullptr);
  ASSERT_EQ(p.fig().reserved_bytes, 20 * MiB);
  ASSERT_EQ(p.pool.deallocate(z, nullptr, true), CUDA_SUCCESS);  // 8 MiB, reusable at once on the legacy stream
  ASSERT_EQ(p.pool.deallocate(y, nullptr, false), CUDA_SUCCESS);  // a closed epoch, pending
  EXPECT_EQ(p.alloc(8 * MiB, nullptr, true), z);
  EXPECT_EQ(p.sim.counters().fence_waits, 1u) << "waited although a free block fitted exactly";
  // Never the open epoch: a free too small to close one is not waited for.
  CachingPoolOptions o;
  o.quarantine_bytes = 64 * MiB;
  PoolUnderTest q(1024 * MiB, o);
  q.sim.set_events_complete_at_once(false);
  void* u = q.alloc(4 * MiB);
  ASSERT_NE(q.alloc(4 * MiB), nullptr);
  ASSERT_EQ(q.pool.deallocate(u, nullptr, false), CUDA_SUCCESS);
  EXPECT_NE(q.alloc(4 * MiB), u);
  EXPECT_EQ(q.sim.counters().fence_waits, 0u);
}

TEST(CachingPool, OneFencePerEpochOfFrees) {
  CachingPoolOptions o;
  o.quarantine_bytes = 8 * MiB;
  PoolUnderTest p(1024 * MiB, o);
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(p.alloc(2 * MiB));  // fills one 20 MiB segment
  for (int i = 0; i < 4; ++i) p.pool.deallocate(blocks[i], nullptr, false);
  EXPECT_EQ(p.fig().quarantined_bytes, 8 * MiB);
  EXPECT_EQ(p.sim.counters().fences_recorded, 1u) << "four frees, one epoch, one fence";
  // The fence has completed: the next allocation reuses the four blocks, merged, without a sync.
  void* c = p.alloc(8 * MiB);
  EXPECT_EQ(c, blocks[0]);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
  EXPECT_EQ(p.fig().quarantined_bytes, 0u);
  EXPECT_EQ(p.fig().reserved_bytes, 20 * MiB);
}

TEST(CachingPool, SynchronizesOnlyWhenMemoryIsShort) {
  PoolUnderTest p(30 * MiB);
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(20 * MiB);
  p.pool.deallocate(a, nullptr, false);
  // 20 MiB freed and still in use cannot serve 24 MiB, and only 10 MiB are left: one sync, the
  // empty segment goes back, and the request gets a segment of its own.
  EXPECT_NE(p.alloc(24 * MiB), nullptr);
  EXPECT_EQ(p.sim.counters().synchronizes, 1u);
  EXPECT_EQ(p.fig().reuse_syncs, 1u);
  EXPECT_EQ(p.fig().reserved_bytes, 24 * MiB);
}

TEST(CachingPool, StreamOrderedFreeIsReusableAtOnceOnTheSameStream) {
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  p.pool.deallocate(a, stream_handle(0x100), true);
  EXPECT_EQ(p.alloc(3 * MiB, stream_handle(0x100), true), a);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
}

TEST(CachingPool, StreamOrderedFreeWaitsForItsEventOnAnotherStream) {
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  // Live, it keeps `a` apart from the segment's free rest (which a stream-ordered free absorbs).
  ASSERT_NE(p.alloc(3 * MiB, stream_handle(0x100), true), nullptr);
  p.pool.deallocate(a, stream_handle(0x100), true);
  void* b = p.alloc(3 * MiB, stream_handle(0x200), true);
  EXPECT_NE(b, a) << "reused on another stream before the free's event completed";
  void* c = p.alloc(3 * MiB);  // a plain cudaMalloc: usable on any stream, so it must wait too
  EXPECT_NE(c, a);
  p.sim.complete_events();
  EXPECT_EQ(p.alloc(3 * MiB, stream_handle(0x200), true), a);
}

TEST(CachingPool, StreamOrderedFreesAskNothingAndMergeInOneBatchBeforeThePoolGrows) {
  // Carved from one 20 MiB segment on two streams and freed there: each free leaves its block
  // apart from the free rest of the segment (no event, no query at the free). A request that
  // only the whole segment fits merges them first: one event per stream, one query per event,
  // and the segment serves it rather than a new one.
  PoolUnderTest p;
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  void* b = p.alloc(3 * MiB, stream_handle(0x100), true);
  void* c = p.alloc(2 * MiB, stream_handle(0x200), true);
  p.pool.deallocate(a, stream_handle(0x100), true);
  p.pool.deallocate(c, stream_handle(0x200), true);
  p.pool.deallocate(b, stream_handle(0x100), true);
  EXPECT_EQ(p.sim.counters().events_recorded, 0u);
  EXPECT_EQ(p.sim.counters().event_queries, 0u);
  EXPECT_EQ(p.alloc(20 * MiB), a);
  EXPECT_EQ(p.sim.counters().events_recorded, 2u);
  EXPECT_EQ(p.sim.counters().event_queries, 2u);
  EXPECT_EQ(p.fig().reserved_bytes, 20 * MiB);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
}

TEST(CachingPool, AStreamOrderedFreeMergesAtOnceWithTheIdleRestOfItsSegment) {
  // A block freed on its stream next to the untouched rest of its segment (ready for anyone)
  // merges with it at the free, under the stream's terms: the stream can have the whole segment
  // at once, with no event recorded or queried, while the device is still busy. Before, the two
  // stayed apart until the stream's work was done (an event per settle), and a request that only
  // the whole segment fits grew the pool (detection_infer stream-ordered under the GPU-time model:
  // 174 vs PyTorch's 154 MiB).
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  ASSERT_EQ(p.pool.deallocate(a, stream_handle(0x100), true), CUDA_SUCCESS);
  EXPECT_EQ(p.alloc(20 * MiB, stream_handle(0x100), true), a);
  EXPECT_EQ(p.fig().reserved_bytes, 20 * MiB);
  EXPECT_EQ(p.sim.counters().events_recorded, 0u);
  EXPECT_EQ(p.sim.counters().event_queries, 0u);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
}

TEST(CachingPool, TheMergedRestWaitsForTheFreesEventOnOtherStreams) {
  // What the rest joined is ordered by the free it joined: another stream (or a plain cudaMalloc)
  // gets none of it until that free's event has completed, and then all of it.
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  p.pool.deallocate(a, stream_handle(0x100), true);
  void* b = p.alloc(17 * MiB, stream_handle(0x200), true);
  void* c = p.alloc(3 * MiB);
  for (void* q : {b, c}) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(q);
    EXPECT_FALSE(at >= reinterpret_cast<uintptr_t>(a) && at < reinterpret_cast<uintptr_t>(a) + 20 * MiB)
        << "handed out memory merged with a free whose event had not completed";
  }
  EXPECT_EQ(p.fig().reserved_bytes, 58 * MiB);  // b: 18 MiB of its own; c: a new 20 MiB segment
  p.sim.complete_events();
  EXPECT_EQ(p.alloc(20 * MiB, stream_handle(0x200), true), a);
  EXPECT_EQ(p.fig().reserved_bytes, 58 * MiB);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
}

TEST(CachingPool, BlocksLeftApartAreSettledOncePerBatchOfFrees) {
  // A block freed on its stream next to one freed on another stream cannot merge with it at the
  // free. Reused and freed there over and over: no event at each free, but every 64 frees one
  // event per stream and one query per event, after which they have merged (best fit then sees
  // them whole, as it would if they had merged at the free).
  PoolUnderTest p;
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  void* other = p.alloc(3 * MiB, stream_handle(0x200), true);
  ASSERT_EQ(p.pool.deallocate(other, stream_handle(0x200), true), CUDA_SUCCESS);  // takes the rest in
  ASSERT_EQ(p.pool.deallocate(a, stream_handle(0x100), true), CUDA_SUCCESS);      // apart: 1 free
  for (int i = 1; i < 63; ++i) {
    ASSERT_EQ(p.alloc(3 * MiB, stream_handle(0x100), true), a);
    ASSERT_EQ(p.pool.deallocate(a, stream_handle(0x100), true), CUDA_SUCCESS);
  }
  EXPECT_EQ(p.sim.counters().events_recorded, 0u);
  EXPECT_EQ(p.sim.counters().event_queries, 0u);
  ASSERT_EQ(p.alloc(3 * MiB, stream_handle(0x100), true), a);
  ASSERT_EQ(p.pool.deallocate(a, stream_handle(0x100), true), CUDA_SUCCESS);  // the 64th
  EXPECT_EQ(p.sim.counters().events_recorded, 2u);
  EXPECT_EQ(p.sim.counters().event_queries, 2u);
  EXPECT_EQ(p.alloc(20 * MiB, stream_handle(0x300), true), a) << "merged with the rest";
  EXPECT_EQ(p.sim.counters().events_recorded, 2u);
  EXPECT_EQ(p.fig().reserved_bytes, 20 * MiB);
}

TEST(CachingPool, AReusedBlockDoesNotInheritAnOldEvent) {
  // The regression the e2e integrity stress caught: a block whose event completed, reused on its
  // stream and freed there again, must wait for a fresh event before another stream gets it.
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(3 * MiB, stream_handle(0x100), true);
  ASSERT_NE(p.alloc(3 * MiB, stream_handle(0x100), true), nullptr);  // keeps `a` apart from the free rest
  p.pool.deallocate(a, stream_handle(0x100), true);
  EXPECT_NE(p.alloc(3 * MiB, stream_handle(0x200), true), a);  // records an event; still pending
  p.sim.complete_events();                                // ... now that event is done
  EXPECT_EQ(p.alloc(3 * MiB, stream_handle(0x100), true), a);   // same-stream reuse: new work on 0x100
  p.pool.deallocate(a, stream_handle(0x100), true);
  EXPECT_NE(p.alloc(3 * MiB, stream_handle(0x200), true), a) << "reused on another stream on a stale event";
}

TEST(CachingPool, PerThreadDefaultStreamIsNeverTheSameStream) {
  PoolUnderTest p;
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(3 * MiB, CU_STREAM_PER_THREAD, true);
  p.pool.deallocate(a, CU_STREAM_PER_THREAD, true);
  EXPECT_NE(p.alloc(3 * MiB, CU_STREAM_PER_THREAD, true), a);
}

TEST(CachingPool, NeverSynchronizesOrQueriesDuringCapture) {
  CachingPoolOptions o;
  o.quarantine_bytes = 0;
  PoolUnderTest p(64 * MiB, o);
  p.sim.set_events_complete_at_once(false);
  void* a = p.alloc(30 * MiB);
  void* s = p.alloc(3 * MiB, stream_handle(0x100), true);
  p.pool.deallocate(a, nullptr, false);
  p.pool.deallocate(s, stream_handle(0x100), true);
  p.sim.set_capturing(true);
  // Memory is short (capacity 64 MiB, 50 MiB held): during capture the pool must fail rather than sync.
  EXPECT_EQ(p.alloc(30 * MiB), nullptr);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
  p.sim.set_capturing(false);
  EXPECT_EQ(p.alloc(30 * MiB), a);
  // After the capture: the freed block's fence is waited for (the work before it), not the device.
  EXPECT_EQ(p.sim.counters().fence_waits, 1u);
  EXPECT_EQ(p.sim.counters().synchronizes, 0u);
}

TEST(CachingPool, OutOfMemoryReleasesCachedSegmentsAndRetriesOnce) {
  PoolUnderTest p(100 * MiB);
  void* a = p.alloc(60 * MiB);
  ASSERT_NE(a, nullptr);
  p.pool.deallocate(a, nullptr, false);
  // 60 MiB cached in a 60 MiB segment; a 70 MiB request only fits once that segment goes back.
  void* b = p.alloc(70 * MiB);
  ASSERT_NE(b, nullptr);
  const PoolFigures f = p.fig();
  EXPECT_EQ(f.alloc_retries, 1u);
  EXPECT_EQ(f.segment_frees, 1u);
  EXPECT_EQ(f.reserved_bytes, 70 * MiB);
  EXPECT_EQ(p.alloc(40 * MiB), nullptr);
  EXPECT_EQ(p.fig().ooms, 1u);
}

TEST(CachingPool, InjectedDriverFailureIsReturnedAndThePoolRecovers) {
  PoolUnderTest p;
  p.sim.fail_next(2);  // the first try and the retry
  EXPECT_EQ(p.alloc(5 * MiB), nullptr);
  EXPECT_NE(p.alloc(5 * MiB), nullptr);
}

TEST(CachingPool, UnknownPointerIsInvalid) {
  PoolUnderTest p;
  void* a = p.alloc(1000);
  EXPECT_EQ(p.pool.deallocate(static_cast<char*>(a) + 512, nullptr, false), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(p.pool.deallocate(a, nullptr, false), CUDA_SUCCESS);
  EXPECT_EQ(p.pool.deallocate(a, nullptr, false), CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(p.pool.contains(static_cast<char*>(a) + 100));
  EXPECT_FALSE(p.pool.contains(reinterpret_cast<void*>(0x1000)));
}

TEST(CachingPool, MaxSplitKeepsOversizeBlocksWhole) {
  CachingPoolOptions o;
  o.max_split = 64 * MiB;
  o.quarantine_bytes = 0;
  PoolUnderTest p(1024 * MiB, o);
  void* big = p.alloc(100 * MiB);
  p.pool.deallocate(big, nullptr, true);
  void* medium = p.alloc(30 * MiB);
  EXPECT_FALSE(medium == big) << "an oversize block was split for a smaller request";
  EXPECT_EQ(p.alloc(100 * MiB), big);
}

// max_split keeps large blocks whole and leaves the small pool alone, whatever its value (the
// config refuses one at or below the large segments' size). At 2 MiB, the small segments' size,
// it once kept each small segment whole for the request that took it, and the block never fit
// another small request: a new segment every allocation, and a loop of 4 KiB tensors reserved
// the whole device.
TEST(CachingPool, MaxSplitAsLowAsTheSmallSegmentLeavesTheSmallPoolAlone) {
  CachingPoolOptions o;
  o.max_split = o.small_segment;
  o.quarantine_bytes = 0;
  PoolUnderTest p(1024 * MiB, o);
  for (int step = 0; step < 1000; ++step) {
    void* a = p.alloc(4096);
    void* b = p.alloc(300 << 10);
    p.pool.deallocate(a, nullptr, true);
    p.pool.deallocate(b, nullptr, true);
  }
  EXPECT_EQ(p.fig().reserved_bytes, o.small_segment);
  // Several small blocks share one small segment.
  void* x = p.alloc(4096);
  void* y = p.alloc(4096);
  EXPECT_EQ(p.fig().reserved_bytes, o.small_segment);
  p.pool.deallocate(x, nullptr, true);
  p.pool.deallocate(y, nullptr, true);
}

TEST(CachingPool, FiguresDescribeFragmentation) {
  CachingPoolOptions o;
  o.quarantine_bytes = 0;
  PoolUnderTest p(1024 * MiB, o);
  std::vector<void*> v;
  for (int i = 0; i < 6; ++i) v.push_back(p.alloc(3 * MiB));  // 18 of a 20 MiB segment
  p.pool.deallocate(v[1], nullptr, true);
  p.pool.deallocate(v[3], nullptr, true);
  const PoolFigures f = p.fig();
  EXPECT_EQ(f.reserved_bytes, 20 * MiB);
  EXPECT_EQ(f.cached_free_bytes, 20 * MiB - 12 * MiB);
  EXPECT_EQ(f.largest_free_block, 3 * MiB);
}

TEST(CachingPool, RandomizedNoOverlapAndExactReserved) {
  CachingPoolOptions o;
  o.quarantine_bytes = 16 * MiB;
  PoolUnderTest p(4096 * MiB, o);
  p.sim.set_events_complete_at_once(false);
  std::mt19937_64 rng(7);
  std::map<uintptr_t, uint64_t> live;
  uint64_t allocated = 0;
  for (int i = 0; i < 20000; ++i) {
    if (!live.empty() && rng() % 2) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const bool ordered = rng() % 2;
      ASSERT_EQ(p.pool.deallocate(reinterpret_cast<void*>(it->first), stream_handle(0x100 + rng() % 3), ordered), CUDA_SUCCESS);
      allocated -= it->second;
      live.erase(it);
    } else {
      const uint64_t size = 1 + (rng() % 4 == 0 ? rng() % (64 * MiB) : rng() % (256 << 10));
      uint64_t got = 0;
      // One draw per statement: the order in which a call's arguments are evaluated is
      // unspecified (gcc and clang differ), and the seed must mean one sequence everywhere.
      const CUstream on = stream_handle(0x100 + rng() % 3);
      const bool ordered = rng() % 2;
      void* ptr = p.alloc(size, on, ordered, &got);
      ASSERT_NE(ptr, nullptr);
      ASSERT_GE(got, size);
      const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + got, next->first) << "overlaps the next live block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, a) << "overlaps the previous live block";
      }
      live.emplace(a, got);
      allocated += got;
    }
    if (i % 1000 == 0) p.sim.complete_events();
  }
  const PoolFigures f = p.fig();
  EXPECT_EQ(f.reserved_bytes, p.sim.used());
  EXPECT_EQ(f.cached_free_bytes, f.reserved_bytes - allocated);
  for (auto& [a, n] : live) ASSERT_EQ(p.pool.deallocate(reinterpret_cast<void*>(a), nullptr, false), CUDA_SUCCESS);
  p.pool.release_cached();
  EXPECT_EQ(p.sim.used(), 0u) << "every segment goes back once everything is free";
}

}  // namespace
}  // namespace gpushim
