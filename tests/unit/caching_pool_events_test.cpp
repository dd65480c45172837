// The caching pool's completion events over a long run: a block reused at once on its own stream
// must let go of the event of its earlier free, or every such reuse leaks one event (and its
// driver handle), and the pool's memory grows with the length of the run (found by LeakSanitizer
// in the soak test).
#include <gtest/gtest.h>

#include "policy/caching_pool.h"
#include "policy/sim_backend.h"

namespace gpushim {
namespace {

constexpr uint64_t MiB = 1ull << 20;

TEST(CachingPoolEvents, SameStreamReuseKeepsEventsBounded) {
  SimBackend sim(1024 * MiB);
  sim.set_events_complete_at_once(false);  // events stay pending: reuse happens by stream order only
  CachingPool pool(sim, CachingPoolOptions{});
  CUstream s = reinterpret_cast<CUstream>(0x100);
  for (int i = 0; i < 1000; ++i) {
    void* p = nullptr;
    uint64_t got = 0;
    ASSERT_EQ(pool.allocate(AllocRequest{3 * MiB, s, true}, &p, &got), CUDA_SUCCESS);
    ASSERT_EQ(pool.deallocate(p, s, true), CUDA_SUCCESS);
  }
  // One free is pending at a time, so one event (plus a split remainder's share of it) at most.
  EXPECT_LE(sim.live_events(), 1u);
  EXPECT_EQ(sim.counters().events_recorded, 1000u);
  PoolFigures f;
  pool.figures(&f);
  EXPECT_LT(f.host_bytes, 4096u) << "the pool's own memory must not grow with the number of reuses";
}

}  // namespace
}  // namespace gpushim
