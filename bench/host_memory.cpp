// Host memory the shim costs per live allocation and per distinct call stack.
//
// Phase "live": N allocations of 4 KiB from one call site, all kept live.
// Phase "stacks": M more, each from a call stack of its own (a 12-level binary tree of call sites,
// 32+ frames deep), also kept live.
// For each phase it prints the growth of the process heap (glibc mallinfo2: in-use bytes plus mmap'ed
// chunks) and how many allocation calls reached the driver, as one JSON line. Run it with and
// without the preload: the difference is the shim's cost (scripts/bench subtracts the simulated
// driver's own per-allocation bookkeeping, measured by the run without the preload). At exit the
// shim's report carries its self-accounted bookkeeping (shim_host_bytes, distinct_stacks).
//
// Usage: host_memory [live N] [stacks M]   (defaults 100000 4096)
#include <cuda_runtime_api.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "call_depth.h"
#include "simulated_device.h"
#include "support/test_support.h"

namespace {

constexpr size_t kSize = 4096;
constexpr int kTreeLevels = 12;

std::vector<void*> g_live;

uint64_t heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

unsigned long long driver_allocs() { return gpushim_bench::simulated_driver_allocs(); }

__attribute__((noinline)) void alloc_here() {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kSize));
  g_live.push_back(p);
  asm volatile("" ::: "memory");
}

// Two call sites per level: the path taken through the tree (the bits of `path`) gives each of the
// 2^levels leaves a call stack no other leaf has.
__attribute__((noinline)) void branch(unsigned path, int level);
__attribute__((noinline)) void left(unsigned path, int level) {
  branch(path, level);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void right(unsigned path, int level) {
  branch(path, level);
  asm volatile("" ::: "memory");
}
void branch(unsigned path, int level) {
  if (level == kTreeLevels) return alloc_here();
  if ((path >> level) & 1) right(path, level + 1);
  else left(path, level + 1);
  asm volatile("" ::: "memory");
}

struct Phase {
  uint64_t heap;
  unsigned long long driver;
};

Phase mark() { return {heap_bytes(), driver_allocs()}; }

}  // namespace

int main(int argc, char** argv) {
  int live = 100000, stacks = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string_view(argv[i]) == "live") live = std::atoi(argv[i + 1]);
    else if (std::string_view(argv[i]) == "stacks") stacks = std::atoi(argv[i + 1]);
  }
  if (stacks > (1 << kTreeLevels)) stacks = 1 << kTreeLevels;
  CHECK(cudaFree(nullptr));
  g_live.reserve(static_cast<size_t>(live + stacks));
  // Warm-up outside the measurement: the shim's first allocation creates its per-device state.
  void* warm = nullptr;
  CHECK(cudaMalloc(&warm, kSize));
  CHECK(cudaFree(warm));

  const Phase a = mark();
  for (int i = 0; i < live; ++i) alloc_here();
  const Phase b = mark();
  // Deep enough that a depth-32 capture is full: ~20 frames of padding under the 12-level tree.
  auto tree = [&] {
    for (int i = 0; i < stacks; ++i) branch(static_cast<unsigned>(i), 0);
  };
  gpushim_bench::at_depth(20, tree);
  const Phase c = mark();

  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  std::printf("{\"live\":%d,\"live_heap_bytes\":%llu,\"live_driver_allocs\":%llu,"
              "\"stacks\":%d,\"stacks_heap_bytes\":%llu,\"stacks_driver_allocs\":%llu,"
              "\"shim\":%s,\"shim_live_count\":%llu}\n",
              live, static_cast<unsigned long long>(b.heap - a.heap), b.driver - a.driver, stacks,
              static_cast<unsigned long long>(c.heap - b.heap), c.driver - b.driver, shim ? "true" : "false",
              shim ? st.live_count : 0ull);
  // Left live on purpose: the report written at exit shows them (and the shim's own cost).
  return 0;
}
