// What attributing an allocation to its module costs on the hot path: the address-to-module
// lookup (a binary search in an immutable snapshot), the per-(module, device, kind) counters, and
// the unwinding fallback used only when the caller is libcudart or libcuda itself.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include "accounting/module_counters.h"
#include "stacks/module_map.h"
#include "stacks/native_stack.h"

namespace gpushim {
namespace {

__attribute__((noinline)) void probe_function() { asm volatile(""); }

void BM_ModuleMapLookupHit(benchmark::State& state) {
  ModuleMap map;
  const uintptr_t self = reinterpret_cast<uintptr_t>(&probe_function);
  const uintptr_t libc = reinterpret_cast<uintptr_t>(dlsym(dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD), "getpid"));
  map.lookup(self);
  bool flip = false;
  for (auto _ : state) {
    benchmark::DoNotOptimize(map.lookup(flip ? self : libc));
    flip = !flip;
  }
}
BENCHMARK(BM_ModuleMapLookupHit)->ThreadRange(1, 2);

void BM_ModuleCountersAllocFree(benchmark::State& state) {
  static ModuleCounters counters;
  ModuleId m = static_cast<ModuleId>(1 + state.thread_index() % 8);
  for (auto _ : state) {
    counters.at(m, 0, MemoryKind::kDevice).on_alloc(4096);
    counters.at(m, 0, MemoryKind::kDevice).on_free(4096);
  }
}
BENCHMARK(BM_ModuleCountersAllocFree)->ThreadRange(1, 2);

// The fallback: unwind and find the first frame outside the plumbing (here, outside this binary).
void BM_FirstFrameOutsidePlumbing(benchmark::State& state) {
  ModuleMap map;
  init_native_unwinder();
  for (auto _ : state) {
    uint64_t frames[64];
    const size_t n = capture_native_stack(frames, 64, 0);
    ModuleId found = kUnknownModule;
    for (size_t i = 0; i < n && found == kUnknownModule; ++i) {
      const ModuleId f = map.lookup(static_cast<uintptr_t>(frames[i]) - 1);
      if (f != kUnknownModule && !map.is_cuda_plumbing(f)) found = f;
    }
    benchmark::DoNotOptimize(found);
  }
}
BENCHMARK(BM_FirstFrameOutsidePlumbing);

}  // namespace
}  // namespace gpushim

BENCHMARK_MAIN();
