// VmmPool under workloads: the driver calls a training loop settles to, randomized runs checked
// against the simulated device, and the fragmentation workload. The pool's rules one by one are
// in vmm_pool_test.cpp.
#include "policy/vmm_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
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
#include "test_scale.h"
#include "test_sizes.h"
#include "vmm_test_pool.h"

namespace gpushim {
namespace {

// ---- driver calls ----

// One iteration of a loop that allocates the same sizes and frees them all; `plain(i)` says
// whether allocation i of an iteration is freed with cudaFree (else cudaFreeAsync on one stream).
template <typename Plain>
void loop_iteration(Vmm& v, const std::vector<uint64_t>& sizes, Plain plain) {
  std::vector<std::pair<void*, bool>> live;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool ordered = !plain(i);
    void* p = v.alloc(sizes[i], ordered ? vmm_stream(0x100) : nullptr, ordered);
    ASSERT_NE(p, nullptr);
    live.emplace_back(p, ordered);
  }
  for (auto& [p, ordered] : live) ASSERT_EQ(v.free(p, ordered ? vmm_stream(0x100) : nullptr, ordered), CUDA_SUCCESS);
}

const std::vector<uint64_t> kLoopSizes = {3 * MiB, 17 * MiB + 4096, 64 * MiB, 5 * MiB + 1, 120 * MiB, 33 * MiB,
                                          200 << 10, 1024, 9 * MiB};

// A block of a size that has outlived a trough of live memory (VmmPoolOptions::long_fall) is
// taken from the top of free memory, any other from the bottom: in training, the gradients that
// live across the trough between steps gather apart from the next step's activations.
TEST(VmmPool, SizesThatOutliveATroughAreTakenFromTheTop) {
  auto place = [](const VmmPoolOptions& o, uintptr_t* lasting, uintptr_t* other, uintptr_t* first) {
    Vmm v(4 * GiB, o);
    void* a = v.alloc(10 * MiB);
    void* g = v.alloc(1 * MiB);
    EXPECT_EQ(v.free(a), CUDA_SUCCESS);  // the trough: 1 MiB live
    void* b = v.alloc(10 * MiB);         // live again
    EXPECT_EQ(v.free(g), CUDA_SUCCESS);  // g lived through the trough: its size votes
    EXPECT_EQ(v.free(b), CUDA_SUCCESS);
    v.sim.complete_events();
    *first = reinterpret_cast<uintptr_t>(a);
    *lasting = reinterpret_cast<uintptr_t>(v.alloc(1 * MiB));
    *other = reinterpret_cast<uintptr_t>(v.alloc(1 * MiB + 4096));
    EXPECT_EQ(v.pool.check_invariants(), "");
  };
  uintptr_t lasting = 0, other = 0, first = 0;
  place(VmmPoolOptions{}, &lasting, &other, &first);
  EXPECT_EQ(other, first);
  EXPECT_GT(lasting, other + 10 * MiB);
  VmmPoolOptions off;
  off.long_fall = 0;
  place(off, &lasting, &other, &first);
  EXPECT_EQ(lasting, first);  // plain best fit: the lowest address
}

TEST(VmmPool, SteadyStateLoopDoesNotMapAgain) {
  // Every allocation site frees the same way each time, as real programs do: all async, all
  // cudaFree, and a fixed mix.
  for (int mode = 0; mode < 3; ++mode) {
    Vmm v;
    auto plain = [&](size_t i) { return mode == 1 || (mode == 2 && i % 3 == 0); };
    SimCounters warm;
    uint64_t warm_reserved = 0;
    for (int it = 0; it < 1000; ++it) {
      loop_iteration(v, kLoopSizes, plain);
      if (it == 99) {
        warm = v.sim.counters();
        warm_reserved = v.fig().peak_reserved_bytes;
      }
    }
    const SimCounters& c = v.sim.counters();
    std::printf("steady state, %s: after 100 iterations %llu maps, %llu unmaps; after 1000 %llu maps, %llu unmaps, "
                "%llu syncs; peak reserved %.0f MiB for 251.2 MiB allocated per iteration\n",
                mode == 0 ? "all async" : mode == 1 ? "all cudaFree" : "mixed", (unsigned long long)warm.maps,
                (unsigned long long)warm.unmaps, (unsigned long long)c.maps, (unsigned long long)c.unmaps,
                (unsigned long long)c.synchronizes, v.fig().peak_reserved_bytes / double(MiB));
    EXPECT_EQ(c.maps, warm.maps) << "mode " << mode << ": map calls do not grow with iterations";
    EXPECT_EQ(c.synchronizes, 0u) << "mode " << mode << ": reuse never waits for the device";
    EXPECT_EQ(c.unmaps, warm.unmaps) << "mode " << mode;
    EXPECT_EQ(c.physical_creates, warm.physical_creates) << "mode " << mode;
    EXPECT_EQ(v.fig().peak_reserved_bytes, warm_reserved) << "mode " << mode;
    // 129 chunks for the loop's blocks, a few small segments for blocks waiting for a fence, and
    // a few remaps while the layout settles.
    EXPECT_LE(warm.maps, 150u) << "mode " << mode << ": about one map per chunk the loop needs, no churn";
    EXPECT_EQ(v.pool.check_invariants(), "");
  }
}

// The allocation sizes of one random loop shape: 4-15 sites, sizes of every class.
std::vector<uint64_t> loop_sizes(std::mt19937_64& rng) {
  std::vector<uint64_t> sizes(4 + rng() % 12);
  for (uint64_t& n : sizes) {
    const int c = static_cast<int>(rng() % 3);
    n = c == 0 ? 1 + rng() % MiB : c == 1 ? MiB + rng() % (8 * MiB) : 8 * MiB + rng() % (200 * MiB);
  }
  return sizes;
}

TEST(VmmPool, LoopsOfManyShapesSettleWithoutRemapping) {
  // Random loop shapes (sizes of every class, each allocation site always freed the same way,
  // FIFO or LIFO). A pool this tight cannot absorb every shift of placement from one iteration to
  // the next; the remap budget makes it grow a little instead of remapping forever.
  std::mt19937_64 rng(5);
  uint64_t moves_after_warmup = 0, loops_with_moves = 0;
  double vmm_util = 0, caching_util = 0;
  constexpr int kLoops = 20;
  for (int loop = 0; loop < kLoops; ++loop) {
    const std::vector<uint64_t> sizes = loop_sizes(rng);
    std::vector<bool> plain(sizes.size());
    for (size_t i = 0; i < plain.size(); ++i) plain[i] = rng() % 3 == 0;
    const bool lifo = rng() % 2;
    uint64_t demand = 0;
    for (uint64_t n : sizes) demand += n;
    for (int policy = 0; policy < 2; ++policy) {
      SimBackend sim(64 * GiB);
      std::unique_ptr<DeviceMemoryResource> pool;
      if (policy == 0) pool = std::make_unique<VmmPool>(sim, VmmPoolOptions{});
      else pool = std::make_unique<CachingPool>(sim, CachingPoolOptions{});
      uint64_t warm_unmaps = 0;
      for (int it = 0; it < 500; ++it) {
        std::vector<void*> live(sizes.size());
        for (size_t i = 0; i < sizes.size(); ++i) {
          uint64_t got = 0;
          ASSERT_EQ(pool->allocate(AllocRequest{sizes[i], plain[i] ? nullptr : vmm_stream(0x100), !plain[i]}, &live[i], &got),
                    CUDA_SUCCESS);
        }
        for (size_t k = 0; k < sizes.size(); ++k) {
          const size_t i = lifo ? sizes.size() - 1 - k : k;
          ASSERT_EQ(pool->deallocate(live[i], plain[i] ? nullptr : vmm_stream(0x100), !plain[i]), CUDA_SUCCESS);
        }
        if (it == 199) warm_unmaps = sim.counters().unmaps;
      }
      const double util = static_cast<double>(demand) / static_cast<double>(sim.peak_used());
      if (policy == 0) {
        moves_after_warmup += sim.counters().unmaps - warm_unmaps;
        loops_with_moves += sim.counters().unmaps != warm_unmaps;
        vmm_util += util / kLoops;
      } else {
        caching_util += util / kLoops;
      }
    }
  }
  std::printf("%d loop shapes: %llu chunk moves after warm-up (in %llu loops); mean utilization vmm %.3f, caching "
              "%.3f\n",
              kLoops, (unsigned long long)moves_after_warmup, (unsigned long long)loops_with_moves, vmm_util,
              caching_util);
  EXPECT_EQ(moves_after_warmup, 0u) << "steady loops stop remapping";
  EXPECT_GT(vmm_util, caching_util);
}

TEST(VmmPool, LoopsSettleWithoutRemappingWhileTheDeviceLagsAnIteration) {
  // Loops as above whose shapes vary from one iteration to the next (a sequence length), with the
  // device an iteration behind the host (replay's --gpu-time model): most freed memory is still
  // queued when the next iteration allocates. Stream-order builds borrow chunks their stream
  // freed and move them for good once idle; that too must settle, and never hold more than
  // idle-only builds.
  std::mt19937_64 rng(5);
  uint64_t moves_after_warmup = 0, borrows = 0, peak_sum[2] = {0, 0};
  constexpr int kLoops = 20;
  for (int loop = 0; loop < kLoops; ++loop) {
    const std::vector<uint64_t> sizes = loop_sizes(rng);
    const bool lifo = rng() % 2;
    uint64_t peak[2] = {0, 0};
    for (int stream_order = 0; stream_order < 2; ++stream_order) {
      SimBackend sim(64 * GiB);
      const uint64_t lag = 2 * sizes.size();  // one iteration, in host ticks (one per call)
      sim.model_completion([lag](uint64_t recorded) { return recorded + lag; });
      VmmPoolOptions o;
      o.stream_order_builds = stream_order == 1;
      VmmPool pool(sim, o);
      std::mt19937_64 shape(static_cast<uint64_t>(loop));  // the same lengths for both
      uint64_t now = 0, warm_unmaps = 0;
      for (int it = 0; it < 500; ++it) {
        const uint64_t quarters = 1 + shape() % 4;
        std::vector<void*> live(sizes.size());
        for (size_t i = 0; i < sizes.size(); ++i) {
          sim.set_clock(++now);
          uint64_t got = 0;
          ASSERT_EQ(pool.allocate(AllocRequest{sizes[i] * quarters / 4 + 1, vmm_stream(0x100), true}, &live[i], &got),
                    CUDA_SUCCESS);
        }
        for (size_t k = 0; k < sizes.size(); ++k) {
          sim.set_clock(++now);
          ASSERT_EQ(pool.deallocate(live[lifo ? sizes.size() - 1 - k : k], vmm_stream(0x100), true), CUDA_SUCCESS);
        }
        if (it == 199) warm_unmaps = sim.counters().unmaps;
      }
      moves_after_warmup += sim.counters().unmaps - warm_unmaps;
      if (stream_order == 1) borrows += pool.stats().borrows;
      peak[stream_order] = sim.peak_used();
      peak_sum[stream_order] += sim.peak_used();
      EXPECT_EQ(pool.check_invariants(), "");
    }
    EXPECT_LE(peak[1], peak[0]) << "loop " << loop << ": stream-order builds held more than idle-only ones";
  }
  std::printf("%d varying loops, device an iteration behind: %llu chunk moves after warm-up, %llu chunks borrowed; "
              "peak reserved summed %llu MiB with stream-order builds, %llu MiB idle-only\n",
              kLoops, (unsigned long long)moves_after_warmup, (unsigned long long)borrows,
              (unsigned long long)(peak_sum[1] >> 20), (unsigned long long)(peak_sum[0] >> 20));
  EXPECT_EQ(moves_after_warmup, 0u) << "steady loops stop remapping";
  EXPECT_GT(borrows, 0u) << "the loops exercise borrowing";
}

TEST(VmmPool, LoopWithRandomFreeKindsSettlesWithinWhatCachingHolds) {
  // Worse: every allocation is freed at random with cudaFree or cudaFreeAsync, so blocks land in
  // different places every iteration. The pool remaps at first, then grows within its budget.
  uint64_t peak[2] = {0, 0};
  uint64_t late_maps = 0;
  for (int policy = 0; policy < 2; ++policy) {
    SimBackend sim(64 * GiB);
    std::unique_ptr<DeviceMemoryResource> pool;
    if (policy == 0) pool = std::make_unique<VmmPool>(sim, VmmPoolOptions{});
    else pool = std::make_unique<CachingPool>(sim, CachingPoolOptions{});
    std::mt19937_64 rng(11);
    uint64_t warm_maps = 0;
    for (int it = 0; it < 1000; ++it) {
      std::vector<std::pair<void*, bool>> live;
      for (uint64_t n : kLoopSizes) {
        const bool ordered = rng() % 2;
        void* p = nullptr;
        uint64_t got = 0;
        ASSERT_EQ(pool->allocate(AllocRequest{n, ordered ? vmm_stream(0x100) : nullptr, ordered}, &p, &got), CUDA_SUCCESS);
        live.emplace_back(p, ordered);
      }
      for (auto& [p, ordered] : live) pool->deallocate(p, ordered ? vmm_stream(0x100) : nullptr, ordered);
      if (it == 299) warm_maps = sim.counters().maps;
    }
    peak[policy] = sim.peak_used();
    if (policy == 0) late_maps = sim.counters().maps - warm_maps;
  }
  std::printf("random free kinds: %.2f maps per iteration after warm-up; peak held vmm %.0f MiB, caching %.0f MiB\n",
              late_maps / 700.0, peak[0] / double(MiB), peak[1] / double(MiB));
  // Caching reuses a freed block as soon as its fence completes, so on this loop it holds about
  // what vmm does (258 vs 264 MiB): vmm may hold up to 3% more, no further.
  EXPECT_LE(peak[0], peak[1] + peak[1] / 32);
  EXPECT_LT(late_maps, 700u) << "less than one map call per iteration once settled";
}

// ---- randomized ----

// Physical ranges (handle, offset, end) under a block, one per chunk it touches.
std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> physical(const SimBackend& sim, uintptr_t a, uint64_t n,
                                                                uint64_t chunk) {
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> out;
  for (uintptr_t x = a; x < a + n;) {
    const uintptr_t end = std::min<uintptr_t>(a + n, (x / chunk + 1) * chunk);
    uint64_t h = 0, off = 0;
    if (sim.translate(x, &h, &off)) out.emplace_back(h, off, off + (end - x));
    x = end;
  }
  return out;
}

// Memory the simulated device may still be using, as CUDA's rules say: work queued before a free
// runs until its event (stream-ordered) or fence (plain) completes. A block may reuse such memory
// only when it is made stream-ordered on the stream that freed it (that stream runs the old work
// first); the new owner then inherits the ordering. Plain frees' memory is released when the pool
// waits for any fence (lenient: the oracle does not know which fence), everything at completion.
struct QueuedWork {
  struct Range {
    uint64_t handle, lo, hi;
    CUstream stream;  // null: a plain free (its fence covers every stream)
  };
  std::vector<Range> ranges;
  uint64_t waits_seen = 0, syncs_seen = 0;

  void freed(const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& memory, CUstream s, bool ordered) {
    for (const auto& [h, lo, hi] : memory) ranges.push_back({h, lo, hi, ordered ? s : nullptr});
  }
  void settle(const SimCounters& c) {
    if (c.synchronizes != syncs_seen) ranges.clear();
    if (c.fence_waits != waits_seen)
      ranges.erase(std::remove_if(ranges.begin(), ranges.end(), [](const Range& r) { return r.stream == nullptr; }),
                   ranges.end());
    waits_seen = c.fence_waits;
    syncs_seen = c.synchronizes;
  }
  // "" when a block on `memory`, made on stream `s` (ordered or not), may use it now.
  std::string reuse(const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& memory, CUstream s, bool ordered) {
    std::string bad;
    for (const auto& [h, lo, hi] : memory)
      for (auto it = ranges.begin(); it != ranges.end();) {
        if (it->handle != h || it->hi <= lo || hi <= it->lo) {
          ++it;
          continue;
        }
        if (!ordered || it->stream != s || s == CU_STREAM_PER_THREAD) {
          bad = std::string(it->stream ? "memory another stream's queued work may still use" : "memory a plain free's queued work may still use") +
                " (handle " + std::to_string(h) + ": [" + std::to_string(lo) + ", " + std::to_string(hi) + ") over [" +
                std::to_string(it->lo) + ", " + std::to_string(it->hi) + ") freed on stream " +
                std::to_string(reinterpret_cast<uintptr_t>(it->stream)) + ", taken on " +
                std::to_string(reinterpret_cast<uintptr_t>(s)) + (ordered ? ", stream-ordered)" : ", plain)");
        }
        it = ranges.erase(it);
      }
    return bad;
  }
};

void randomized(uint64_t seed, uint64_t capacity, const VmmPoolOptions& o, int ops, bool large_only = false) {
  Vmm v(capacity, o);
  v.sim.set_events_complete_at_once(false);
  std::mt19937_64 rng(seed);
  struct Live {
    uint64_t size;
    std::vector<std::pair<uint64_t, uint64_t>> backing;
  };
  std::map<uintptr_t, Live> live;
  QueuedWork queued;
  uint64_t allocated = 0, failures = 0;
  for (int i = 0; i < ops; ++i) {
    if (!live.empty() && rng() % 2) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_EQ(backing(v.sim, it->first, it->second.size), it->second.backing) << "live memory moved, op " << i;
      const bool ordered = rng() % 2;
      const CUstream on = vmm_stream(0x100 + rng() % 3);
      queued.freed(physical(v.sim, it->first, it->second.size, v.sim.granularity()), on, ordered);
      ASSERT_EQ(v.free(reinterpret_cast<void*>(it->first), on, ordered), CUDA_SUCCESS);
      allocated -= it->second.size;
      live.erase(it);
    } else {
      uint64_t size = 1 + (rng() % 3 == 0 ? rng() % (96 * MiB) : rng() % (3 * MiB));
      if (large_only) size = std::max<uint64_t>(size, v.pool.options().medium_max + 1);
      uint64_t got = 0;
      // One draw per statement: the order in which a call's arguments are evaluated is
      // unspecified (gcc and clang differ), and the seed must mean one sequence everywhere.
      const CUstream on = vmm_stream(0x100 + rng() % 3);
      const bool ordered = rng() % 2;
      void* ptr = v.alloc(size, on, ordered, &got);
      if (ptr == nullptr) {
        ++failures;
        continue;
      }
      ASSERT_GE(got, size);
      const uintptr_t a = addr(ptr);
      queued.settle(v.sim.counters());
      ASSERT_EQ(queued.reuse(physical(v.sim, a, got, v.sim.granularity()), on, ordered), "") << "op " << i;
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + got, next->first) << "overlaps the next live block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.size, a) << "overlaps the previous live block";
      }
      live.emplace(a, Live{got, backing(v.sim, a, got)});
      allocated += got;
    }
    if (i % 500 == 0) {
      v.sim.complete_events();
      queued.ranges.clear();
    }
    if (i % 1000 == 0) v.sim.set_capturing(!v.sim.capture_active() && rng() % 4 == 0);
    if (i % 250 == 0) {
      ASSERT_EQ(v.pool.check_invariants(), "") << "op " << i;
      // Lending maps memory at two addresses: live blocks must still never share a byte of it.
      std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> ranges;
      for (auto& [a, l] : live)
        for (auto& r : physical(v.sim, a, l.size, v.sim.granularity())) ranges.push_back(r);
      std::sort(ranges.begin(), ranges.end());
      for (size_t k = 1; k < ranges.size(); ++k) {
        if (std::get<0>(ranges[k]) != std::get<0>(ranges[k - 1])) continue;
        ASSERT_LE(std::get<2>(ranges[k - 1]), std::get<1>(ranges[k])) << "two live blocks on the same memory, op " << i;
      }
    }
  }
  v.sim.set_capturing(false);
  const PoolFigures f = v.fig();
  EXPECT_EQ(f.reserved_bytes, v.sim.used()) << "reserved is exactly the physical memory held";
  EXPECT_EQ(f.mapped_bytes, v.sim.mapped_bytes());
  EXPECT_EQ(f.cached_free_bytes, f.reserved_bytes - allocated);
  EXPECT_EQ(f.peak_reserved_bytes, v.sim.peak_used());
  std::printf("randomized seed %llu: %llu failures, %llu maps, %llu unmaps, %llu lent chunk ends, peak %.0f MiB\n",
              (unsigned long long)seed, (unsigned long long)failures, (unsigned long long)f.map_calls,
              (unsigned long long)f.unmap_calls, (unsigned long long)v.pool.stats().aliases,
              f.peak_reserved_bytes / double(MiB));
  for (auto& [a, l] : live) ASSERT_EQ(v.free(reinterpret_cast<void*>(a), nullptr, false), CUDA_SUCCESS);
  v.pool.release_cached();
  EXPECT_EQ(v.sim.used(), 0u) << "every chunk goes back once everything is free";
  EXPECT_EQ(v.sim.mapped_bytes(), 0u);
  EXPECT_EQ(v.sim.reservations(), 0u);
  EXPECT_EQ(v.sim.live_events(), 0u) << "no event leaked";
  EXPECT_EQ(v.pool.check_invariants(), "");
}

TEST(VmmPool, RandomizedNoOverlapStableBackingAndExactReserved) { randomized(7, 64 * GiB, {}, scaled(20000, 3000)); }

TEST(VmmPool, RandomizedLargeBlocksOnly) { randomized(9, 64 * GiB, {}, scaled(20000, 3000), /*large_only=*/true); }

// The oracle under what the run above leaves out (a review helper's widening, which found a lend
// undone after a refused build handing its queued memory to another stream): the per-thread
// default stream (never "the same stream"), captures toggled often (the pool can then neither
// synchronize nor record), refused memory (fail_next), a small device, and the classic layout.
std::string adversarial(uint64_t seed, const VmmPoolOptions& o, bool faults, bool capture) {
  Vmm v(256 * MiB, o);
  v.sim.set_events_complete_at_once(false);
  std::mt19937_64 rng(seed);
  QueuedWork queued;
  std::map<uintptr_t, uint64_t> live;
  auto stream_of = [](uint64_t k) { return k == 3 ? CU_STREAM_PER_THREAD : vmm_stream(0x100 + k); };
  for (int i = 0; i < 3000; ++i) {
    if (!live.empty() && rng() % 2) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const bool ordered = rng() % 2;
      const CUstream on = stream_of(rng() % 4);
      // A free during a capture on a default stream waits for a fence (reuse_rules.h, retire): a
      // plain free to the oracle. On a created stream it stays that stream's.
      queued.freed(physical(v.sim, it->first, it->second, v.sim.granularity()), on,
                   ordered && (!v.sim.capture_active() || names_created_stream(on)));
      if (v.free(reinterpret_cast<void*>(it->first), on, ordered) != CUDA_SUCCESS) return "free failed";
      live.erase(it);
    } else {
      const uint64_t size = rng() % 4 == 0 ? (rng() % 64 + 1) * 4 * KiB : (rng() % 48 + 1) * 256 * KiB;
      const bool ordered = rng() % 2;
      const CUstream on = stream_of(rng() % 4);
      if (faults && rng() % 8 == 0) v.sim.fail_next(static_cast<int>(rng() % 3 + 1));
      uint64_t got = 0;
      void* p = v.alloc(size, on, ordered, &got);
      v.sim.fail_next(0);
      if (p == nullptr) continue;
      queued.settle(v.sim.counters());
      const std::string bad = queued.reuse(physical(v.sim, addr(p), got, v.sim.granularity()), on, ordered);
      if (!bad.empty()) return "op " + std::to_string(i) + ": " + bad;
      live.emplace(addr(p), got);
    }
    if (i % 400 == 0) {
      v.sim.complete_events();
      queued.ranges.clear();
    }
    if (capture && i % 50 == 0) v.sim.set_capturing(!v.sim.capture_active() && rng() % 3 == 0);
    if (i % 200 == 0)
      if (std::string e = v.pool.check_invariants(); !e.empty()) return "op " + std::to_string(i) + ": " + e;
  }
  v.sim.set_capturing(false);
  return v.pool.check_invariants();
}

TEST(VmmPool, RandomizedWithCapturesRefusalsAndPerThreadStreams) {
  for (int cfg = 0; cfg < 8; ++cfg) {
    VmmPoolOptions o = cfg & 4 ? classic() : VmmPoolOptions{};
    for (uint64_t seed = 1; seed <= static_cast<uint64_t>(scaled(12, 3)); ++seed) {
      const std::string r = adversarial(seed, o, cfg & 1, cfg & 2);
      ASSERT_EQ(r, "") << "layout " << (cfg & 4 ? "classic" : "packed") << (cfg & 1 ? ", refusals" : "")
                       << (cfg & 2 ? ", captures" : "") << ", seed " << seed;
    }
  }
}

TEST(VmmPool, RandomizedUnderMemoryPressure) {
  VmmPoolOptions o;
  o.reserve = 0;
  o.piece = 16 * MiB;  // runs: pieces that pin, the harder case for stitching
  randomized(8, 768 * MiB, o, scaled(20000, 3000));
}

// ---- fragmentation ----

struct Utilization {
  double by_allocated = 0;  // peak of the pool's rounded sizes / peak physical memory held
  double by_requested = 0;  // peak of the sizes asked for / peak physical memory held
  uint64_t peak_allocated = 0, peak_requested = 0, peak_reserved = 0, maps = 0, unmaps = 0, syncs = 0;
};

Utilization replay(DeviceMemoryResource& pool, SimBackend& sim, const std::vector<workload::Op>& ops) {
  std::vector<void*> ptr;
  std::vector<uint64_t> got, req;
  uint64_t alloc_now = 0, req_now = 0;
  Utilization u;
  for (const workload::Op& op : ops) {
    const CUstream s = op.stream == 0 ? nullptr : vmm_stream(0x100 + op.stream);
    if (op.kind == workload::Op::Kind::kAlloc) {
      if (ptr.size() <= op.id) {
        ptr.resize(op.id + 1);
        got.resize(op.id + 1);
        req.resize(op.id + 1);
      }
      EXPECT_EQ(pool.allocate(AllocRequest{op.size, s, op.stream_ordered}, &ptr[op.id], &got[op.id]), CUDA_SUCCESS);
      req[op.id] = op.size;
      alloc_now += got[op.id];
      req_now += op.size;
      u.peak_allocated = std::max(u.peak_allocated, alloc_now);
      u.peak_requested = std::max(u.peak_requested, req_now);
    } else {
      EXPECT_EQ(pool.deallocate(ptr[op.id], s, op.stream_ordered), CUDA_SUCCESS);
      alloc_now -= got[op.id];
      req_now -= req[op.id];
    }
  }
  u.peak_reserved = sim.peak_used();
  u.by_allocated = static_cast<double>(u.peak_allocated) / static_cast<double>(u.peak_reserved);
  u.by_requested = static_cast<double>(u.peak_requested) / static_cast<double>(u.peak_reserved);
  u.maps = sim.counters().maps;
  u.unmaps = sim.counters().unmaps;
  u.syncs = sim.counters().synchronizes;
  return u;
}

TEST(VmmPool, FragmentationWorkloadUtilization) {
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    workload::FragmentationOptions wo;
    wo.seed = seed;
    const std::vector<workload::Op> ops = workload::fragmentation_workload(wo);
    Utilization caching, vmm;
    {
      SimBackend sim(256 * GiB);
      CachingPool pool(sim, CachingPoolOptions{});
      caching = replay(pool, sim, ops);
    }
    {
      SimBackend sim(256 * GiB);
      VmmPool pool(sim, VmmPoolOptions{});
      vmm = replay(pool, sim, ops);
      EXPECT_EQ(pool.check_invariants(), "");
    }
    std::printf("fragmentation seed %llu (%zu ops, peak allocated %.0f MiB): caching %.3f (requested %.3f, peak "
                "reserved %.0f MiB, %llu syncs); vmm %.3f (requested %.3f, peak reserved %.0f MiB, %llu maps, "
                "%llu unmaps, %llu syncs)\n",
                (unsigned long long)seed, ops.size(), vmm.peak_allocated / double(MiB), caching.by_allocated,
                caching.by_requested, caching.peak_reserved / double(MiB), (unsigned long long)caching.syncs,
                vmm.by_allocated, vmm.by_requested, vmm.peak_reserved / double(MiB), (unsigned long long)vmm.maps,
                (unsigned long long)vmm.unmaps, (unsigned long long)vmm.syncs);
    EXPECT_GE(vmm.by_allocated, 0.97) << "seed " << seed;
    EXPECT_LT(caching.by_allocated, 0.90) << "seed " << seed << ": the workload no longer fragments the caching pool";
  }
}

uint64_t trace_hash(const std::vector<workload::Op>& ops) {
  uint64_t h = 1469598103934665603ull;
  for (const workload::Op& op : ops) {
    for (uint64_t x : {uint64_t(op.kind), uint64_t(op.id), op.size, uint64_t(op.stream), uint64_t(op.stream_ordered)})
      h = (h ^ x) * 1099511628211ull;
  }
  return h;
}

TEST(VmmPool, FragmentationWorkloadIsDeterministic) {
  workload::FragmentationOptions wo;
  const uint64_t first = trace_hash(workload::fragmentation_workload(wo));
  EXPECT_EQ(trace_hash(workload::fragmentation_workload(wo)), first);
  wo.seed = 2;
  EXPECT_NE(trace_hash(workload::fragmentation_workload(wo)), first);
}

}  // namespace
}  // namespace gpushim
