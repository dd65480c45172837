// GPUSHIM_OWN_SEGMENT_MIN and what pools say about IPC and pointer queries.
#include "policy/own_segments.h"

#include <gtest/gtest.h>

#include "config/config.h"
#include "policy/caching_pool.h"
#include "policy/policy_factory.h"
#include "policy/sim_backend.h"
#include "test_sizes.h"

namespace gpushim {
namespace {


void* alloc(DeviceMemoryResource& r, size_t n, uint64_t* got = nullptr) {
  void* p = nullptr;
  uint64_t a = 0;
  if (r.allocate(AllocRequest{n, nullptr, false}, &p, &a) != CUDA_SUCCESS) return nullptr;
  if (got) *got = a;
  return p;
}

PoolFigures figures(const DeviceMemoryResource& r) {
  PoolFigures f;
  r.figures(&f);
  return f;
}

TEST(CachingPoolQueries, FindsTheLiveBlockHoldingAnAddress) {
  SimBackend sim(1024 * MiB);
  CachingPool pool(sim, {});
  char* a = static_cast<char*>(alloc(pool, 4096));
  char* b = static_cast<char*>(alloc(pool, 10000));
  ASSERT_EQ(b, a + 4096);  // carved from one small segment
  uintptr_t base = 0;
  uint64_t size = 0;
  ASSERT_TRUE(pool.find_block(b + 9000, &base, &size));
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(b));
  EXPECT_EQ(size, 10240u);
  ASSERT_TRUE(pool.find_block(a, &base, &size));
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(a));
  // Past the last block, and after a free: no live block there.
  EXPECT_FALSE(pool.find_block(b + 20000, &base, &size));
  ASSERT_EQ(pool.deallocate(b, nullptr, false), CUDA_SUCCESS);
  EXPECT_FALSE(pool.find_block(b + 10, &base, &size));
  int outside = 0;
  EXPECT_FALSE(pool.find_block(&outside, &base, &size));
}

TEST(CachingPoolQueries, FindBlockFollowsMergedBlocks) {
  SimBackend sim(1024 * MiB);
  CachingPoolOptions o;
  o.quarantine_bytes = 0;
  CachingPool pool(sim, o);
  char* a = static_cast<char*>(alloc(pool, 4096));
  char* b = static_cast<char*>(alloc(pool, 4096));
  ASSERT_EQ(pool.deallocate(a, nullptr, false), CUDA_SUCCESS);
  ASSERT_EQ(pool.deallocate(b, nullptr, false), CUDA_SUCCESS);
  pool.release_cached();  // merges everything back into the segment, then frees it
  char* c = static_cast<char*>(alloc(pool, 8192));  // a fresh segment, and its head block
  uintptr_t base = 0;
  uint64_t size = 0;
  ASSERT_TRUE(pool.find_block(c + 8000, &base, &size));
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(c));
  EXPECT_EQ(size, 8192u);
}

TEST(CachingPoolQueries, OnlyBlocksThatStartTheirSegmentAreIpcExportable) {
  SimBackend sim(1024 * MiB);
  CachingPool pool(sim, {});
  void* first = alloc(pool, 4096);
  void* second = alloc(pool, 4096);
  void* large = alloc(pool, 32 * MiB);
  EXPECT_EQ(pool.ipc_export_refusal(first, 4096), nullptr);
  EXPECT_NE(pool.ipc_export_refusal(second, 4096), nullptr);
  EXPECT_EQ(pool.ipc_export_refusal(large, 32 * MiB), nullptr);
  ASSERT_EQ(pool.deallocate(second, nullptr, false), CUDA_SUCCESS);
  EXPECT_NE(pool.ipc_export_refusal(second, 4096), nullptr);  // not live any more
}

TEST(OwnSegments, LargeAllocationsGetASegmentOfTheirOwn) {
  SimBackend sim(1024 * MiB);
  Config c;
  c.own_segment_min = 64 * 1024;
  std::unique_ptr<DeviceMemoryResource> r = make_pool(c, sim);
  ASSERT_NE(r, nullptr);
  uint64_t got = 0;
  void* small = alloc(*r, 4096);
  void* big = alloc(*r, 100000, &got);
  void* big2 = alloc(*r, 100000);
  EXPECT_EQ(got, 100352u);  // rounded to 512 bytes, not to a segment size
  EXPECT_EQ(sim.counters().segment_allocs, 3u);  // one small segment, two own segments
  EXPECT_EQ(r->ipc_export_refusal(big, got), nullptr);
  EXPECT_EQ(r->ipc_export_refusal(big2, got), nullptr);
  uintptr_t base = 0;
  uint64_t size = 0;
  ASSERT_TRUE(r->find_block(static_cast<char*>(big) + 5000, &base, &size));
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(big));
  EXPECT_EQ(size, got);
  EXPECT_TRUE(r->contains(small));
  EXPECT_TRUE(r->contains(static_cast<char*>(big2) + 1));
  // Exact figures across both parts.
  PoolFigures f = figures(*r);
  EXPECT_EQ(f.reserved_bytes, 2 * MiB + 2 * got);
  EXPECT_EQ(f.reserved_bytes, sim.used());
  EXPECT_EQ(f.segment_allocs, 3u);
  // Freed own segments go straight back to the driver.
  ASSERT_EQ(r->deallocate(big, nullptr, false), CUDA_SUCCESS);
  EXPECT_EQ(sim.counters().segment_frees, 1u);
  EXPECT_FALSE(r->contains(big));
  f = figures(*r);
  EXPECT_EQ(f.reserved_bytes, 2 * MiB + got);
  EXPECT_EQ(f.peak_reserved_bytes, 2 * MiB + 2 * got);
  EXPECT_EQ(f.segment_frees, 1u);
  EXPECT_EQ(r->deallocate(small, nullptr, false), CUDA_SUCCESS);  // the pool's block, to the pool
}

TEST(OwnSegments, FreesDuringCaptureWaitUntilItEnds) {
  SimBackend sim(1024 * MiB);
  Config c;
  c.own_segment_min = 1 * MiB;
  std::unique_ptr<DeviceMemoryResource> r = make_pool(c, sim);
  void* big = alloc(*r, 4 * MiB);
  sim.set_capturing(true);
  ASSERT_EQ(r->deallocate(big, nullptr, false), CUDA_SUCCESS);
  EXPECT_EQ(sim.counters().segment_frees, 0u);  // cuMemFree would invalidate the capture
  EXPECT_TRUE(r->contains(big));                 // still the driver's allocation, held by us
  sim.set_capturing(false);
  void* other = alloc(*r, 4 * MiB);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(sim.counters().segment_frees, 1u);
}

TEST(OwnSegments, AnOutOfMemoryReleasesThePoolsCacheAndRetries) {
  SimBackend sim(24 * MiB);
  Config c;
  c.own_segment_min = 8 * MiB;
  c.quarantine_bytes = 0;
  std::unique_ptr<DeviceMemoryResource> r = make_pool(c, sim);
  void* medium = alloc(*r, 5 * MiB);  // a 20 MiB segment of the pool
  ASSERT_NE(medium, nullptr);
  ASSERT_EQ(r->deallocate(medium, nullptr, false), CUDA_SUCCESS);  // cached by the pool
  void* big = alloc(*r, 16 * MiB);
  EXPECT_NE(big, nullptr);
}

TEST(OwnSegments, ConfigAcceptsBytesOrOff) {
  EXPECT_EQ(parse_config({{"GPUSHIM_OWN_SEGMENT_MIN", "2MiB"}}).config.own_segment_min, 2 * MiB);
  EXPECT_EQ(parse_config({{"GPUSHIM_OWN_SEGMENT_MIN", "off"}}).config.own_segment_min, 0u);
  EXPECT_FALSE(parse_config({{"GPUSHIM_OWN_SEGMENT_MIN", "0"}}).ok());
  EXPECT_FALSE(parse_config({{"GPUSHIM_OWN_SEGMENT_MIN", "lots"}}).ok());
  // Passthrough needs none: every allocation is already its own driver allocation.
  Config c;
  c.policy = PolicyKind::kPassthrough;
  c.own_segment_min = MiB;
  SimBackend sim(64 * MiB);
  EXPECT_EQ(make_pool(c, sim), nullptr);
}

}  // namespace
}  // namespace gpushim
