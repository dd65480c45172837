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
  void* alloc(CUstream s) {
    void* p = nullptr;
    uint64_t got = 0;
    EXPECT_EQ(pool.allocate(AllocRequest{4096, s, true}, &p, &got), CUDA_SUCCESS);
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

// A block freed in the order of a stream of another context (one the program made) is ordered by
// an event recorded there at the free: the pool's own stream of the same handle is not that
// stream, and the pool's synchronization (memory short, cudaMemPoolTrimTo, empty_cache) covers its
// own context only. Before 2026-11-27 the synchronization released it to its next owner while the
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
  EXPECT_EQ(sim.counters().events_recorded, events + 1);  // at the free, in that context
  EXPECT_NE(alloc(theirs), a);
  const uint64_t syncs = sim.counters().synchronizes;
  pool.trim_to(0);
  EXPECT_EQ(sim.counters().synchronizes, syncs + 1);
  EXPECT_NE(alloc(stream(2)), a);
  sim.complete_events();  // that context's work is done
  EXPECT_EQ(alloc(stream(2)), a);
}

}  // namespace
}  // namespace gpushim
