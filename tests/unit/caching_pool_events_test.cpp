// Stream-ordered reuse and completion events: a block reused at once on its own stream must come
// back without the stream and event of its earlier free. Left there, that stale event would vouch
// for the block after its next free, and another stream could get it while work queued after the
// stale event still writes it (before the fix: handed out; found while merging the lazy-event pool
// with the soak's leak fix).
#include <gtest/gtest.h>

#include "policy/caching_pool.h"
#include "policy/sim_backend.h"
#include "test_sizes.h"

namespace gpushim {
namespace {


struct Pool {
  Pool() : sim(1024 * MiB), pool(sim, CachingPoolOptions{}) { sim.set_events_complete_at_once(false); }
  void* alloc(CUstream s) {
    void* p = nullptr;
    uint64_t got = 0;
    EXPECT_EQ(pool.allocate(AllocRequest{3 * MiB, s, true}, &p, &got), CUDA_SUCCESS);
    return p;
  }
  SimBackend sim;
  CachingPool pool;
};

const CUstream kA = reinterpret_cast<CUstream>(0x100);
const CUstream kB = reinterpret_cast<CUstream>(0x200);

TEST(CachingPoolEvents, StaleEventNeverVouchesForALaterFree) {
  Pool p;
  void* first = p.alloc(kA);
  ASSERT_NE(p.alloc(kA), nullptr);  // live: keeps `first` apart from its segment's free rest
  ASSERT_EQ(p.pool.deallocate(first, kA, true), CUDA_SUCCESS);
  // Stream B asks: an event is recorded for the block now; it is pending, so B gets other memory.
  void* on_b = p.alloc(kB);
  EXPECT_NE(on_b, first);
  // Stream A takes its block back at once (same stream), works on it, and frees it again.
  EXPECT_EQ(p.alloc(kA), first);
  ASSERT_EQ(p.pool.deallocate(first, kA, true), CUDA_SUCCESS);
  // Only the first event completes; work queued on A after it may still use the block.
  p.sim.complete_events();
  EXPECT_NE(p.alloc(kB), first) << "handed to stream B on the strength of an event older than its last free";
}

TEST(CachingPoolEvents, EventsStayBoundedOverManyReuses) {
  Pool p;
  for (int i = 0; i < 1000; ++i) {
    void* a = p.alloc(kA);
    ASSERT_EQ(p.pool.deallocate(a, kA, true), CUDA_SUCCESS);
    void* b = p.alloc(kB);  // looks at A's block, records an event for it
    ASSERT_EQ(p.pool.deallocate(b, kB, true), CUDA_SUCCESS);
    p.sim.complete_events();
  }
  EXPECT_LE(p.sim.live_events(), 4u);
  PoolFigures f;
  p.pool.figures(&f);
  EXPECT_LT(f.host_bytes, 8192u) << "the pool's own memory must not grow with the number of reuses";
}

}  // namespace
}  // namespace gpushim
