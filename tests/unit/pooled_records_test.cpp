// Pools that keep the allocation records (accounting/pooled_records.h): the record and every figure
// move with the block, under the pool's one lock.
#include "accounting/pooled_records.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "policy/caching_pool.h"
#include "policy/sim_backend.h"
#include "policy/vmm_pool.h"
#include "test_sizes.h"

namespace gpushim {
namespace {


struct Device {
  Device() : sim(1024 * MiB), pool(sim, CachingPoolOptions{}) {}
  void* alloc(size_t n, StackId stack, ModuleId module = 3, uint64_t* got = nullptr) {
    AllocationRecord rec{0, n, 1, stack, 0, MemoryKind::kDevice, Route::kPooled, module};
    PooledAlloc hooks(counters, sites, tracker, torch, rec, false);
    void* p = nullptr;
    uint64_t a = 0;
    if (pool.allocate_with(AllocRequest{n, nullptr, false}, &p, &a, hooks) != CUDA_SUCCESS) return nullptr;
    EXPECT_EQ(hooks.record().size, a);
    if (got) *got = a;
    return p;
  }
  CUresult free(void* p, bool host_api = false, AllocationRecord* rec = nullptr) {
    PooledFree hooks(counters, sites, tracker, torch, host_api);
    const CUresult r = pool.deallocate_with(p, nullptr, false, hooks);
    if (rec) *rec = hooks.record();
    return r;
  }
  std::map<StackId, SiteTotals> site_map() {
    std::vector<std::pair<SiteKey, SiteTotals>> v;
    pool.with_lock([&] { sites.append_to(0, MemoryKind::kDevice, &v); });
    std::map<StackId, SiteTotals> m;
    for (const auto& [k, t] : v) m[k.stack] = t;
    return m;
  }
  ModuleSnapshot module_row(ModuleId m) {
    AllocationRecord rec;
    rec.module = m;
    return tracker.module_row(rec).snapshot();
  }
  SimBackend sim;
  CachingPool pool;
  MemoryCounters counters;
  PooledSites sites;
  AllocationTracker tracker;
  torch_stats::DeviceStats torch;
};

TEST(PooledRecords, RecordAndFiguresMoveWithTheBlock) {
  Device d;
  uint64_t got = 0;
  void* a = d.alloc(1000, 7, 3, &got);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(got, 1024u);
  BlockPayload payload;
  ASSERT_TRUE(d.pool.find_payload(a, &payload));
  const AllocationRecord rec = load_record(payload);
  EXPECT_EQ(rec.size, 1024u);
  EXPECT_EQ(rec.requested, 1000u);
  EXPECT_EQ(rec.stack, 7u);
  EXPECT_EQ(rec.module, 3);
  EXPECT_EQ(rec.route, Route::kPooled);
  EXPECT_NE(rec.serial, 0u);
  EXPECT_EQ(d.counters.snapshot().live_bytes, 1024u);
  EXPECT_EQ(d.counters.snapshot().requested_bytes, 1000u);
  EXPECT_EQ(d.site_map()[7].bytes, 1024u);
  EXPECT_EQ(d.module_row(3).live_bytes, 1024u);
  // The tracker holds no record of it: the pool's block is its only home.
  EXPECT_FALSE(d.tracker.find(reinterpret_cast<uintptr_t>(a), nullptr));

  AllocationRecord freed;
  ASSERT_EQ(d.free(a, false, &freed), CUDA_SUCCESS);
  EXPECT_EQ(freed.serial, rec.serial);
  EXPECT_EQ(freed.size, 1024u);
  EXPECT_FALSE(d.pool.find_payload(a, &payload));
  const CounterSnapshot c = d.counters.snapshot();
  EXPECT_EQ(c.live_bytes, 0u);
  EXPECT_EQ(c.live_count, 0u);
  EXPECT_EQ(c.peak_bytes, 1024u);
  EXPECT_EQ(c.peak_requested_bytes, 1000u);
  EXPECT_EQ(c.total_allocs, 1u);
  EXPECT_EQ(c.total_frees, 1u);
  EXPECT_TRUE(d.site_map().empty());
  EXPECT_EQ(d.module_row(3).live_bytes, 0u);
  EXPECT_EQ(d.module_row(3).peak_bytes, 1024u);
  EXPECT_EQ(d.module_row(3).total_frees, 1u);

  // A new allocation, a new serial (what tells apart two allocations made at one address).
  void* b = d.alloc(1000, 7);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(d.pool.find_payload(b, &payload));
  EXPECT_NE(load_record(payload).serial, rec.serial);
}

TEST(PooledRecords, DoubleAndInteriorFreesFindNothingAndMoveNothing) {
  Device d;
  void* a = d.alloc(4096, 1);
  void* keep = d.alloc(4096, 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(keep, nullptr);
  void* interior = static_cast<char*>(keep) + 512;
  EXPECT_EQ(d.free(interior), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(d.free(a), CUDA_SUCCESS);
  EXPECT_EQ(d.free(a), CUDA_ERROR_NOT_FOUND);  // double free
  const CounterSnapshot c = d.counters.snapshot();
  EXPECT_EQ(c.live_bytes, 4096u);
  EXPECT_EQ(c.total_frees, 1u);
  EXPECT_EQ(d.site_map().size(), 1u);
  EXPECT_EQ(d.site_map()[2].count, 1u);
  EXPECT_TRUE(d.pool.contains(a));  // the core refuses such frees instead of forwarding them
}

TEST(PooledRecords, RefusedFreeKeepsTheBlockLive) {
  Device d;
  void* a = d.alloc(4096, 1);
  ASSERT_NE(a, nullptr);
  AllocationRecord rec;
  EXPECT_EQ(d.free(a, /*host_api=*/true, &rec), CUDA_ERROR_NOT_PERMITTED);  // cudaFreeHost of device memory
  EXPECT_EQ(rec.size, 4096u);
  BlockPayload payload;
  EXPECT_TRUE(d.pool.find_payload(a, &payload));
  PoolFigures f;
  d.pool.figures(&f);
  EXPECT_EQ(f.reserved_bytes - f.cached_free_bytes, 4096u);
  EXPECT_EQ(d.counters.snapshot().live_bytes, 4096u);
  EXPECT_EQ(d.counters.snapshot().total_frees, 0u);
  EXPECT_EQ(d.free(a), CUDA_SUCCESS);
}

// Pooled allocations move the figures with plain stores under the pool's lock; other writers of
// the same figures (forwarded device memory) take that lock. Several threads of each: exact.
TEST(PooledRecords, FiguresExactUnderConcurrentAllocFreeAndLockedWriters) {
  Device d;
  constexpr int kThreads = 4, kRounds = 3000, kHeld = 8;
  std::atomic<uint64_t> forwarded{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> held;
      for (int i = 0; i < kRounds; ++i) {
        void* p = d.alloc(512 * (1 + (i + t) % 4), static_cast<StackId>(1 + t), static_cast<ModuleId>(3 + t % 2));
        ASSERT_NE(p, nullptr);
        held.push_back(p);
        if (held.size() > kHeld) {
          ASSERT_EQ(d.free(held.front()), CUDA_SUCCESS);
          held.erase(held.begin());
        }
        // A forwarded allocation of the same device, counted the way Shim::track does.
        d.pool.with_lock([&] { d.counters.on_alloc(100, 100); });
        d.pool.with_lock([&] { d.counters.on_free(100, 100); });
        forwarded.fetch_add(1, std::memory_order_relaxed);
      }
      for (void* p : held) ASSERT_EQ(d.free(p), CUDA_SUCCESS);
    });
  }
  // A reader meanwhile, as the live thread or a report would read.
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      // (A reader without the lock may see the live total before the peak that follows it.)
      const CounterSnapshot c = d.counters.snapshot();
      EXPECT_LE(c.total_frees, c.total_allocs);
      uint64_t live = 0;
      for (const auto& [stack, t] : d.site_map()) live += t.bytes;  // consistent: read under the lock
      EXPECT_LE(live, uint64_t{kThreads} * (kHeld + 1) * 2048);
    }
  });
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  const CounterSnapshot c = d.counters.snapshot();
  EXPECT_EQ(c.live_bytes, 0u);
  EXPECT_EQ(c.requested_bytes, 0u);
  EXPECT_EQ(c.total_allocs, uint64_t{kThreads} * kRounds + forwarded.load());
  EXPECT_EQ(c.total_frees, c.total_allocs);
  EXPECT_GE(c.peak_bytes, 512u * (kHeld + 1));
  EXPECT_LE(c.peak_bytes, uint64_t{kThreads} * (kHeld + 1) * 2048 + kThreads * 100);
  EXPECT_TRUE(d.site_map().empty());
  EXPECT_EQ(d.module_row(3).live_bytes + d.module_row(4).live_bytes, 0u);
  EXPECT_EQ(d.module_row(3).total_allocs + d.module_row(4).total_allocs, uint64_t{kThreads} * kRounds);
  PoolFigures f;
  d.pool.figures(&f);
  EXPECT_EQ(f.reserved_bytes, f.cached_free_bytes);
}

// The vmm policy: every block carries its record, sub-allocated or an arena block; a block
// allocate() served (no record in it) is not found by deallocate_with, whose caller then frees
// it through its own record.
void vmm_blocks_carry_records(const VmmPoolOptions& o, uint64_t small_size, uint64_t large_size) {
  SimBackend sim(4ull << 30);
  VmmPool pool(sim, o);
  ASSERT_TRUE(pool.holds_payloads());
  MemoryCounters counters;
  PooledSites sites;
  AllocationTracker tracker;
  torch_stats::DeviceStats torch;
  AllocationRecord rec{0, 4096, 1, 5, 0, MemoryKind::kDevice, Route::kPooled, 3};
  void* small = nullptr;
  uint64_t got = 0, total = 0;
  PooledAlloc a(counters, sites, tracker, torch, rec, false);
  ASSERT_EQ(pool.allocate_with(AllocRequest{small_size, nullptr, false}, &small, &got, a), CUDA_SUCCESS);
  total += got;
  BlockPayload payload;
  ASSERT_TRUE(pool.find_payload(small, &payload));
  EXPECT_EQ(load_record(payload).stack, 5u);
  EXPECT_EQ(counters.snapshot().live_bytes, total);

  void* big = nullptr;
  PooledAlloc b(counters, sites, tracker, torch, rec, false);
  ASSERT_EQ(pool.allocate_with(AllocRequest{large_size, nullptr, false}, &big, &got, b), CUDA_SUCCESS);
  total += got;
  ASSERT_TRUE(pool.find_payload(big, &payload));
  EXPECT_EQ(load_record(payload).stack, 5u);
  EXPECT_EQ(counters.snapshot().live_bytes, total);
  std::vector<uintptr_t> live;
  pool.live_payload_blocks(&live);
  std::sort(live.begin(), live.end());
  std::vector<uintptr_t> want{reinterpret_cast<uintptr_t>(small), reinterpret_cast<uintptr_t>(big)};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(live, want);

  void* plain = nullptr;
  ASSERT_EQ(pool.allocate(AllocRequest{large_size, nullptr, false}, &plain, &got), CUDA_SUCCESS);
  PooledFree f(counters, sites, tracker, torch, false);
  EXPECT_EQ(pool.deallocate(plain, nullptr, false), CUDA_SUCCESS);
  EXPECT_EQ(pool.deallocate_with(big, nullptr, false, f), CUDA_SUCCESS);
  EXPECT_EQ(pool.deallocate_with(small, nullptr, false, f), CUDA_SUCCESS);
  EXPECT_EQ(pool.deallocate_with(small, nullptr, false, f), CUDA_ERROR_NOT_FOUND) << "already freed";
  EXPECT_EQ(counters.snapshot().live_bytes, 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PooledRecords, VmmPoolBlocksCarryRecords) { vmm_blocks_carry_records(VmmPoolOptions{}, 4096, 12ull << 20); }

TEST(PooledRecords, VmmPoolWithSubAllocationCarriesRecordsInBothParts) {
  VmmPoolOptions o;
  o.small_max = 1ull << 20;
  o.medium_max = 8ull << 20;
  o.whole_chunks = true;
  vmm_blocks_carry_records(o, 4096, o.medium_max + 1);
}

}  // namespace
}  // namespace gpushim
