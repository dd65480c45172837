// The books (accounting/device_ledger.h): the three transactions on a device's figures, and the
// lock rule that lets pooled and forwarded memory of one device move the same figures.
#include "accounting/device_ledger.h"

#include <gtest/gtest.h>

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


AllocationRecord forwarded(uint64_t size, StackId stack, int device = 0, MemoryKind kind = MemoryKind::kDevice) {
  return AllocationRecord{size, size, 1, stack, static_cast<int16_t>(device), kind, Route::kForwarded, 3};
}

// One device served by a caching pool whose segments come from a simulated driver under the cap.
struct Books {
  explicit Books(uint64_t limit = 0) : ledger(0, ledgers.records()), sim(1024 * MiB) {
    ledger.set_limit(limit);
    pool = std::make_unique<CachingPool>(ledger.capped(sim), CachingPoolOptions{});
    ledger.serve_with(pool.get());
    ledgers.add(&ledger);
  }
  void* pooled(size_t n, StackId stack) {
    AllocationRecord rec{0, n, 1, stack, 0, MemoryKind::kDevice, Route::kPooled, 3};
    void* p = nullptr;
    return ledger.pool_allocate(AllocRequest{n, nullptr, false}, &p, rec, false) == CUDA_SUCCESS ? p : nullptr;
  }
  CUresult free_pooled(void* p) {
    AllocationRecord rec;
    DeviceLedger* owner = nullptr;
    return ledgers.release_pooled(p, nullptr, false, false, &rec, &owner);
  }
  std::map<StackId, SiteTotals> sites() const {
    std::map<StackId, SiteTotals> m;
    for (const auto& [k, t] : ledgers.sites()) m[k.stack] = t;
    return m;
  }
  Ledgers ledgers;
  DeviceLedger ledger;
  SimBackend sim;
  std::unique_ptr<CachingPool> pool;
};

TEST(DeviceLedger, AdmitChargesTheCapAndSettleEndsTheCharge) {
  Books b(10 * MiB);
  EXPECT_TRUE(b.ledger.admit(8 * MiB));
  EXPECT_FALSE(b.ledger.admit(4 * MiB));  // 8 + 4 > 10, even before the first is settled
  EXPECT_EQ(b.ledger.counters().snapshot().failed_allocs, 1u);
  b.ledger.settle(8 * MiB, true);
  EXPECT_EQ(b.ledger.budget().held(), 8 * MiB);
  EXPECT_EQ(b.ledger.figures().reserved_bytes, 8 * MiB);
  EXPECT_TRUE(b.ledger.admit(2 * MiB));
  b.ledger.settle(2 * MiB, false);  // CUDA refused it: nothing held
  EXPECT_EQ(b.ledger.budget().held(), 8 * MiB);
  EXPECT_EQ(b.ledger.budget().charged(), 8 * MiB);
  // Memory made before the ledger could be asked: refused past the cap only when it can be undone.
  EXPECT_FALSE(b.ledger.admit_made(4 * MiB, /*enforce_cap=*/true));
  EXPECT_TRUE(b.ledger.admit_made(4 * MiB, /*enforce_cap=*/false));
  EXPECT_EQ(b.ledger.budget().held(), 12 * MiB);
  EXPECT_EQ(b.ledger.counters().snapshot().failed_allocs, 2u);
}

TEST(DeviceLedger, CommitAndReleaseOfForwardedMemoryMoveCountersAndBudget) {
  Books b;
  ASSERT_TRUE(b.ledger.admit(3 * MiB));
  b.ledger.settle(3 * MiB, true);
  ASSERT_TRUE(b.ledgers.commit(0x1000, forwarded(3 * MiB, 5)));
  EXPECT_FALSE(b.ledgers.commit(0x1000, forwarded(3 * MiB, 5)));  // live already: nothing changes
  EXPECT_EQ(b.ledger.counters().snapshot().live_bytes, 3 * MiB);
  EXPECT_EQ(b.sites()[5].bytes, 3 * MiB);

  // Forgotten before the real free, put back when CUDA refuses it: no figure moved.
  AllocationRecord rec;
  ASSERT_TRUE(b.ledgers.forget(0x1000, &rec));
  b.ledgers.restore(0x1000, rec);
  EXPECT_EQ(b.ledger.counters().snapshot().live_bytes, 3 * MiB);
  EXPECT_EQ(b.ledger.budget().held(), 3 * MiB);

  ASSERT_TRUE(b.ledgers.release(0x1000, &rec));
  EXPECT_EQ(b.ledger.counters().snapshot().live_bytes, 0u);
  EXPECT_EQ(b.ledger.counters().snapshot().total_frees, 1u);
  EXPECT_EQ(b.ledger.budget().held(), 0u);  // forwarded device memory is no longer held
  EXPECT_FALSE(b.ledgers.release(0x1000, &rec));
}

// CUDA's own pools reserve beyond what is allocated from them (32 MiB chunks), and that slack is
// held from the driver. Memory taken on top of it (a pool segment, cudaMalloc under passthrough)
// must raise the peak with the slack, and memory allocated out of the slack must not count twice.
TEST(DeviceLedger, PeakReservedCountsCudaPoolSlackUnderEveryLaterAllocation) {
  Books b;
  const auto cuda_pool = reinterpret_cast<CUmemoryPool>(0x60);
  auto from_cuda_pool = [&](uintptr_t ptr, uint64_t size, uint64_t pool_reserves) {
    ASSERT_TRUE(b.ledger.admit(size));
    b.ledger.settle(size, true, /*from_cuda_pool=*/true);
    ASSERT_TRUE(b.ledgers.commit(ptr, forwarded(size, 1)));
    b.ledger.note_cuda_pool_alloc(cuda_pool, ptr, size);
    b.ledger.note_cuda_pool_reserved(cuda_pool, pool_reserves);
  };
  from_cuda_pool(0x1000, 1 * MiB, 32 * MiB);
  EXPECT_EQ(b.ledger.figures().peak_reserved_bytes, 32 * MiB);
  from_cuda_pool(0x2000, 2 * MiB, 32 * MiB);  // out of the pool's slack: nothing more is held
  EXPECT_EQ(b.ledger.figures().reserved_bytes, 32 * MiB);
  EXPECT_EQ(b.ledger.figures().peak_reserved_bytes, 32 * MiB);

  // Both freed into the pool, which keeps its 32 MiB.
  for (uintptr_t ptr : {uintptr_t{0x1000}, uintptr_t{0x2000}}) {
    AllocationRecord rec;
    ASSERT_TRUE(b.ledgers.forget(ptr, &rec));
    ASSERT_NE(b.ledger.note_cuda_pool_free(ptr, rec.size), nullptr);
    b.ledgers.count_free(rec);
    b.ledger.note_cuda_pool_reserved(cuda_pool, 32 * MiB);
  }
  EXPECT_EQ(b.ledger.figures().reserved_bytes, 32 * MiB);

  // 100 MiB forwarded past any pool, then a pool segment: each held on top of the slack.
  ASSERT_TRUE(b.ledger.admit(100 * MiB));
  b.ledger.settle(100 * MiB, true);
  ASSERT_TRUE(b.ledgers.commit(0x3000, forwarded(100 * MiB, 2)));
  EXPECT_EQ(b.ledger.figures().reserved_bytes, 132 * MiB);
  EXPECT_EQ(b.ledger.figures().peak_reserved_bytes, 132 * MiB);
  AllocationRecord rec;
  ASSERT_TRUE(b.ledgers.release(0x3000, &rec));
  void* p = b.pooled(4096, 3);  // a 2 MiB segment
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(b.ledger.figures().reserved_bytes, 34 * MiB);
  EXPECT_EQ(b.ledger.figures().peak_reserved_bytes, 132 * MiB);
}

TEST(DeviceLedger, MemoryOnNoDeviceHasItsOwnCounters) {
  Books b;
  ASSERT_TRUE(b.ledgers.commit(0x2000, forwarded(4096, 1, 0, MemoryKind::kHost)));
  b.ledgers.failed(MemoryKind::kManaged, 0);
  EXPECT_EQ(b.ledgers.counters(MemoryKind::kHost, -1)->snapshot().live_bytes, 4096u);
  EXPECT_EQ(b.ledgers.counters(MemoryKind::kManaged, -1)->snapshot().failed_allocs, 1u);
  EXPECT_EQ(b.ledger.counters().snapshot().live_bytes, 0u);
  AllocationRecord rec;
  ASSERT_TRUE(b.ledgers.release(0x2000, &rec));
  EXPECT_EQ(b.ledgers.counters(MemoryKind::kHost, -1)->snapshot().live_bytes, 0u);
  EXPECT_EQ(b.ledgers.counters(MemoryKind::kDevice, 7), nullptr);  // a device never seen
}

TEST(DeviceLedger, PooledBlocksKeepTheirRecordsInThePoolAndShowInTheSites) {
  Books b;
  ASSERT_TRUE(b.ledger.pool_keeps_records());
  void* p = b.pooled(1000, 9);
  ASSERT_NE(p, nullptr);
  AllocationRecord rec;
  ASSERT_TRUE(b.ledger.find_pooled(reinterpret_cast<uintptr_t>(p), &rec));
  EXPECT_EQ(rec.size, 1024u);
  EXPECT_FALSE(b.ledgers.records().find(reinterpret_cast<uintptr_t>(p), &rec));  // the block is its home
  // A forwarded allocation at the same site: one site, both counted.
  ASSERT_TRUE(b.ledgers.commit(0x3000, forwarded(4096, 9)));
  EXPECT_EQ(b.sites()[9].bytes, 1024u + 4096u);
  EXPECT_EQ(b.sites()[9].count, 2u);
  // Segments are held through the cap: the pool's reserve is the budget's.
  PoolFigures f;
  b.pool->figures(&f);
  EXPECT_GT(f.reserved_bytes, 0u);
  EXPECT_EQ(f.reserved_bytes, b.ledger.budget().held());
  EXPECT_EQ(b.free_pooled(p), CUDA_SUCCESS);
  EXPECT_EQ(b.free_pooled(p), CUDA_ERROR_NOT_FOUND);  // a double free moves nothing
  EXPECT_EQ(b.sites()[9].count, 1u);
  EXPECT_EQ(b.ledger.counters().snapshot().live_bytes, 4096u);
}

// The lock rule: pooled blocks move the figures with plain stores under the pool's lock, and
// forwarded memory of the same device takes that lock to move the same figures. Threads of both
// kinds at once: the figures come out exact.
TEST(DeviceLedger, PooledAndForwardedWritersOfOneDeviceStayExact) {
  Books b;
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        if (t % 2 == 0) {
          void* p = b.pooled(512 + 256 * (i % 4), t);
          ASSERT_NE(p, nullptr);
          ASSERT_EQ(b.free_pooled(p), CUDA_SUCCESS);
        } else {
          const uintptr_t key = 0x100000ull * (t + 1) + 0x1000ull * (i % 16);
          ASSERT_TRUE(b.ledger.admit(4096));
          b.ledger.settle(4096, true);
          ASSERT_TRUE(b.ledgers.commit(key, forwarded(4096, t)));
          AllocationRecord rec;
          ASSERT_TRUE(b.ledgers.release(key, &rec));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const CounterSnapshot c = b.ledger.counters().snapshot();
  EXPECT_EQ(c.live_bytes, 0u);
  EXPECT_EQ(c.live_count, 0u);
  EXPECT_EQ(c.total_allocs, uint64_t{kThreads} * kRounds);
  EXPECT_EQ(c.total_frees, uint64_t{kThreads} * kRounds);
  EXPECT_TRUE(b.sites().empty());
  // Every forwarded charge ended with its free: what is held is the pool's segments only.
  PoolFigures f;
  b.pool->figures(&f);
  EXPECT_EQ(b.ledger.budget().held(), f.reserved_bytes);
}

// The vmm arena maps a chunk's free tail a second time under a new block (lending, vmm_arena.h):
// the device holds that memory once, so PyTorch's reserved_bytes counts it once and equals the
// pool's reserved (it counted every address: 8 MiB reserved where the device held 6).
TEST(DeviceLedger, VmmMemoryMappedTwiceIsReservedOnce) {
  Ledgers ledgers;
  DeviceLedger ledger(0, ledgers.records());
  SimBackend sim(1024 * MiB);
  VmmPool pool(ledger.capped(sim), VmmPoolOptions{});
  ledger.serve_with(&pool);
  ledgers.add(&ledger);
  auto alloc = [&](size_t n) {
    AllocationRecord rec{0, n, 1, 1, 0, MemoryKind::kDevice, Route::kPooled, 3};
    void* p = nullptr;
    return ledger.pool_allocate(AllocRequest{n, nullptr, false}, &p, rec, false) == CUDA_SUCCESS ? p : nullptr;
  };
  auto free = [&](void* p) {
    AllocationRecord rec;
    DeviceLedger* owner = nullptr;
    return ledgers.release_pooled(p, nullptr, false, false, &rec, &owner);
  };
  auto reserved = [&] { return ledger.torch_figures().stat[torch_stats::kReservedBytes][torch_stats::kAll]; };
  void* a = alloc(512 << 10);
  void* f = alloc(1536 << 10);  // the rest of a's chunk
  ASSERT_NE(alloc(2 * MiB), nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(free(f), CUDA_SUCCESS);
  sim.complete_events();
  void* big = alloc(3 * MiB);  // starts on f's memory, mapped again; one new chunk
  ASSERT_NE(big, nullptr);
  ASSERT_EQ(pool.stats().aliases, 1u) << "the case at hand";
  EXPECT_EQ(sim.used(), 6 * MiB);
  EXPECT_EQ(reserved().current, 6 * MiB);
  EXPECT_EQ(reserved().peak, 6 * MiB);
  EXPECT_EQ(reserved().current, ledger.figures().reserved_bytes);
  // The second mapping goes with the block: the memory stays reserved at its first address.
  ASSERT_EQ(free(big), CUDA_SUCCESS);
  pool.release_cached();
  EXPECT_EQ(sim.used(), 4 * MiB);
  EXPECT_EQ(reserved().current, 4 * MiB);
  EXPECT_EQ(reserved().peak, 6 * MiB);
}

}  // namespace
}  // namespace gpushim
