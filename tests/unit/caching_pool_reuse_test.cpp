// A block reused on the stream that freed it, then freed on another stream, must wait for that
// other stream: the event recorded for its first free says nothing about its second.
#include <gtest/gtest.h>

#include "policy/caching_pool.h"
#include "policy/sim_backend.h"
#include "test_sizes.h"

namespace gpushim {
namespace {

// Created streams: 1, 2 and 3 are CUDA's legacy and per-thread default streams and our own mark.
CUstream stream(uintptr_t v) { return reinterpret_cast<CUstream>(0x1000 * v); }

// A caching pool whose recorded events stay pending until complete_events(), and its 4 KiB
// stream-ordered requests.
struct LateEvents {
  SimBackend sim{1024 * MiB};
  CachingPool pool{sim, {}};
  LateEvents() { sim.set_events_complete_at_once(false); }
  void* alloc(CUstream s, uint64_t n = 4096) {
    void* p = nullptr;
    uint64_t got = 0;
    EXPECT_EQ(pool.allocate(AllocRequest{n, s, true}, &p, &got), CUDA_SUCCESS);
    return p;
  }
};

TEST(CachingPoolReuse, AnEventOfAnEarlierFreeNeverVouchesForALaterOne) {
  LateEvents t;
  auto& [sim, pool] = t;
  auto alloc = [&](CUstream s) { return t.alloc(s); };
  void* a = alloc(stream(1));
  ASSERT_NE(alloc(stream(1)), nullptr);  // live: keeps `a` apart from its segment's free rest
  ASSERT_EQ(pool.deallocate(a, stream(1), true), CUDA_SUCCESS);
  // Another stream wants it: an event is recorded on stream 1, still pending, so not this block.
  void* other = alloc(stream(2));
  EXPECT_NE(other, a);
  sim.complete_events();  // stream 1's work is done
  // Stream 1 takes its own block back, uses it, and frees it on stream 3 (whose work is pending).
  EXPECT_EQ(alloc(stream(1)), a);
  ASSERT_EQ(pool.deallocate(a, stream(3), true), CUDA_SUCCESS);
  // Stream 4 must not get it on the strength of the old, completed event of stream 1.
  void* fourth = alloc(stream(4));
  EXPECT_NE(fourth, a);
  sim.complete_events();
  EXPECT_EQ(alloc(stream(5)), a);
}

// A block freed in the order of a stream of another context (one the program made): that stream
// takes it back at once, anyone else once an event recorded there (in that context) completes;
// the pool's synchronization (memory short, cudaMemPoolTrimTo, empty_cache) covers its own
// context only. Before 2026-11-27 the synchronization released it to its next owner while the
// other context's work still wrote it.
TEST(CachingPoolReuse, ABlockFreedInAnotherContextsOrderWaitsForItsOwnEventThroughASynchronization) {
  LateEvents t;
  auto& [sim, pool] = t;
  auto alloc = [&](CUstream s) { return t.alloc(s); };
  const CUstream theirs = stream(7);
  sim.set_foreign_stream(theirs);
  void* a = alloc(stream(1));
  ASSERT_NE(alloc(stream(1)), nullptr);  // live: keeps `a` apart from its segment's free rest
  const uint64_t events = sim.counters().events_recorded;
  ASSERT_EQ(pool.deallocate(a, theirs, true), CUDA_SUCCESS);
  // No event at the free: the handle of a created stream names it whatever the context.
  EXPECT_EQ(sim.counters().events_recorded, events);
  // That stream itself takes it back at once (its own order), as CUDA's pools do; without it a
  // program working in its own context held a block per step while the device lagged, and
  // failed when memory ran short (a review helper's e2e program_ctx_only).
  EXPECT_EQ(alloc(theirs), a);
  ASSERT_EQ(pool.deallocate(a, theirs, true), CUDA_SUCCESS);
  const uint64_t syncs = sim.counters().synchronizes;
  pool.trim_to(0);
  EXPECT_EQ(sim.counters().synchronizes, syncs + 1);
  EXPECT_NE(alloc(stream(2)), a);
  sim.complete_events();  // that context's work is done
  EXPECT_EQ(alloc(stream(2)), a);
}

// Two neighbours freed in the order of another context's stream merge (the same stream), which
// drops their events; the merged block must still wait for that stream through the pool's
// synchronization, and an event recorded for it later is recorded there.
TEST(CachingPoolReuse, MergedBlocksOfAnotherContextsStreamStillWaitThroughASynchronization) {
  LateEvents t;
  auto& [sim, pool] = t;
  auto alloc = [&](CUstream s, uint64_t n) { return t.alloc(s, n); };
  const CUstream theirs = stream(7);
  sim.set_foreign_stream(theirs);
  void* a = alloc(stream(1), 4096);
  void* b = alloc(stream(1), 4096);
  ASSERT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 4096);
  ASSERT_NE(alloc(stream(1), 4096), nullptr);  // live: keeps them apart from the segment's free rest
  ASSERT_EQ(pool.deallocate(a, theirs, true), CUDA_SUCCESS);
  ASSERT_EQ(pool.deallocate(b, theirs, true), CUDA_SUCCESS);
  pool.trim_to(0);
  EXPECT_EQ(sim.counters().synchronizes, 1u);
  void* c = alloc(stream(2), 8192);
  EXPECT_NE(c, a) << "released by a synchronization of the pool's context";
  sim.complete_events();  // that context's work is done
  EXPECT_EQ(alloc(stream(2), 8192), a);
}

}  // namespace
}  // namespace gpushim
