// The VmmPool the unit tests drive, over a simulated backend, and what they read back from it:
// shared by vmm_pool_test.cpp (the pool's rules) and vmm_pool_workloads_test.cpp (loops,
// randomized runs, fragmentation). An anonymous namespace: the test binary is a unity build, and
// each batch includes this once.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "policy/device_budget.h"
#include "policy/limited_backend.h"
#include "policy/sim_backend.h"
#include "policy/vmm_pool.h"
#include "test_sizes.h"

namespace gpushim {
namespace {

[[maybe_unused]] CUstream vmm_stream(uintptr_t v) { return reinterpret_cast<CUstream>(v); }
[[maybe_unused]] uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A VmmPool over a SimBackend, optionally capped by a LimitedBackend in between (the shim's chain).
struct Vmm {
  explicit Vmm(uint64_t capacity = 4 * GiB, VmmPoolOptions o = {}, uint64_t limit = 0)
      : sim(capacity), limited(sim, budget), pool(make(limit), o) {}
  Backend& make(uint64_t limit) {
    budget.set_limit(limit);
    return limited;
  }
  void* alloc(size_t n, CUstream s = nullptr, bool ordered = false, uint64_t* got = nullptr) {
    void* p = nullptr;
    uint64_t a = 0;
    const CUresult r = pool.allocate(AllocRequest{n, s, ordered}, &p, &a);
    if (got) *got = a;
    return r == CUDA_SUCCESS ? p : nullptr;
  }
  CUresult free(void* p, CUstream s = nullptr, bool ordered = false) { return pool.deallocate(p, s, ordered); }
  PoolFigures fig() const {
    PoolFigures f;
    pool.figures(&f);
    return f;
  }
  SimBackend sim;
  DeviceBudget budget;
  LimitedBackend limited;
  VmmPool pool;
};

// The arena's first design, still an option: small and medium requests sub-allocated from
// whole-chunk segments by a CachingPool, large blocks rounded to whole chunks.
[[maybe_unused]] VmmPoolOptions classic() {
  VmmPoolOptions o;
  o.small_max = 1 * MiB;
  o.medium_max = 8 * MiB;
  o.whole_chunks = true;
  return o;
}

// What backs a block: (handle, offset) at its first, middle and last byte.
[[maybe_unused]] std::vector<std::pair<uint64_t, uint64_t>> backing(const SimBackend& sim, uintptr_t a, uint64_t n) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uintptr_t x : {a, a + n / 2, a + n - 1}) {
    uint64_t h = 0, off = 0;
    if (!sim.translate(x, &h, &off)) h = off = UINT64_MAX;
    out.emplace_back(h, off);
  }
  return out;
}

}  // namespace
}  // namespace gpushim
