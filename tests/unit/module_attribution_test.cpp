// Attribution by module: the address-to-module map the hot path uses, and the per-module counters
// the allocation table keeps.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "accounting/allocation_tracker.h"
#include "accounting/module_counters.h"
#include "stacks/module_map.h"

namespace gpushim {
namespace {

__attribute__((noinline)) void attributed_function() { asm volatile(""); }

// A function of libc itself (sanitizers interpose malloc and friends in their own runtime).
void* libc_getpid_address() { return dlsym(dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD), "getpid"); }

std::string base(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

TEST(ModuleMap, FindsTheExecutableAndSharedObjects) {
  ModuleMap map;
  const ModuleId self = map.lookup(reinterpret_cast<uintptr_t>(&attributed_function));
  ASSERT_NE(self, kUnknownModule);
  EXPECT_EQ(base(map.name(self)), "gpushim_unit_test");
  // The module that holds the map's own code is the shim, whatever its file is called (here the
  // test links the core statically): its frames never name who allocated.
  EXPECT_TRUE(map.is_cuda_plumbing(self));
  const ModuleId libc = map.lookup(reinterpret_cast<uintptr_t>(libc_getpid_address()));
  ASSERT_NE(libc, kUnknownModule);
  EXPECT_NE(libc, self);
  EXPECT_EQ(base(map.name(libc)).rfind("libc.so", 0), 0u) << map.name(libc);
  // The same module keeps its id.
  EXPECT_EQ(map.lookup(reinterpret_cast<uintptr_t>(&attributed_function) + 1), self);
}

TEST(ModuleMap, AddressesOutsideEveryModuleAreUnknown) {
  ModuleMap map;
  int on_the_stack = 0;
  EXPECT_EQ(map.lookup(reinterpret_cast<uintptr_t>(&on_the_stack)), kUnknownModule);
  EXPECT_EQ(map.lookup(0), kUnknownModule);
  EXPECT_EQ(map.name(kUnknownModule), "");
  EXPECT_FALSE(map.is_cuda_plumbing(kUnknownModule));
}

TEST(ModuleMap, SeesLibrariesLoadedLaterAndNamesCudaPlumbing) {
  ModuleMap map;
  ASSERT_NE(map.lookup(reinterpret_cast<uintptr_t>(&attributed_function)), kUnknownModule);  // snapshot taken
  // libcuda from the simulated device (the tests' LD_LIBRARY_PATH does not include it: use the
  // build tree's path).
  void* h = dlopen(GPUSHIM_FAKECUDA_DIR "/libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  void* f = dlsym(h, "cuInit");
  ASSERT_NE(f, nullptr);
  const ModuleId cuda = map.lookup(reinterpret_cast<uintptr_t>(f));
  ASSERT_NE(cuda, kUnknownModule);
  EXPECT_EQ(base(map.name(cuda)), "libcuda.so.1");
  EXPECT_TRUE(map.is_cuda_plumbing(cuda));
  // Other libraries are not plumbing.
  const ModuleId libc = map.lookup(reinterpret_cast<uintptr_t>(libc_getpid_address()));
  EXPECT_FALSE(map.is_cuda_plumbing(libc));
}

// A report names frames of a dlclose'd library from the map, as the loaded set stood when the
// report began: libraries loaded after that (libdw's dependencies, loaded to write the report) may
// land at the same address and must not take the frame over.
TEST(ModuleMap, UnloadedLibrariesAreNamedAsTheReportsMomentSawThem) {
  ModuleMap map;
  const std::string lib = GPUSHIM_FAKECUDA_DIR "/libcudart.so.13";
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  const uintptr_t code = reinterpret_cast<uintptr_t>(dlsym(h, "cudaMalloc"));
  ASSERT_NE(code, 0u);
  const ModuleId id = map.lookup(code);
  ASSERT_EQ(base(map.name(id)), "libcudart.so.13");
  std::string path;
  uintptr_t load_base = 0;
  EXPECT_FALSE(map.describe_unloaded(map.view(), code, &path, &load_base)) << "still loaded";
  dlclose(h);
  ASSERT_EQ(dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << "not unloaded";
  const ModuleMap::View report_began = map.view();
  ASSERT_TRUE(map.describe_unloaded(report_began, code, &path, &load_base));
  EXPECT_EQ(base(path), "libcudart.so.13");
  EXPECT_GT(code, load_base);
  EXPECT_LT(code - load_base, uintptr_t{1} << 24);
  // Loaded again (at the same address or not) after the report's moment: that moment still says
  // unloaded, and a later one knows what is there now.
  h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr);
  const uintptr_t again = reinterpret_cast<uintptr_t>(dlsym(h, "cudaMalloc"));
  map.lookup(again);
  EXPECT_TRUE(map.describe_unloaded(report_began, code, &path, &load_base));
  EXPECT_FALSE(map.describe_unloaded(map.view(), again, &path, &load_base));
  // An address the map never saw in any module is not named.
  int on_the_stack = 0;
  EXPECT_FALSE(map.describe_unloaded(map.view(), reinterpret_cast<uintptr_t>(&on_the_stack), &path, &load_base));
  dlclose(h);
}

TEST(ModuleMap, ConcurrentLookupsAgree) {
  ModuleMap map;
  const uintptr_t probe = reinterpret_cast<uintptr_t>(&attributed_function);
  const ModuleId want = map.lookup(probe);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i)
        if (map.lookup(probe) != want) ++wrong;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ModuleCounters, OneSlotPerCombination) {
  ModuleCounters c;
  c.at(3, 0, MemoryKind::kDevice).on_alloc(100);
  c.at(3, 0, MemoryKind::kDevice).on_alloc(50);
  c.at(3, 1, MemoryKind::kDevice).on_alloc(7);
  c.at(3, -1, MemoryKind::kHost).on_alloc(9);
  c.at(4, 0, MemoryKind::kDevice).on_alloc(11);
  c.at(3, 0, MemoryKind::kDevice).on_free(100);
  std::map<std::tuple<int, int, int>, ModuleSnapshot> seen;
  c.for_each([&](ModuleId m, int d, MemoryKind k, const ModuleTotals& mc) {
    seen[{m, d, static_cast<int>(k)}] = mc.snapshot();
  });
  ASSERT_EQ(seen.size(), 4u);
  const ModuleSnapshot s = seen[{3, 0, 0}];
  EXPECT_EQ(s.live_bytes, 50u);
  EXPECT_EQ(s.peak_bytes, 150u);
  EXPECT_EQ(s.total_allocs, 2u);
  EXPECT_EQ(s.total_frees, 1u);
  EXPECT_EQ((seen[{3, -1, static_cast<int>(MemoryKind::kHost)}].live_bytes), 9u);
  EXPECT_EQ((seen[{4, 0, 0}].live_bytes), 11u);
}

TEST(ModuleCounters, OverflowKeepsTotalsExact) {
  ModuleCounters c;
  uint64_t total = 0;
  // Far more combinations than slots: the excess lands in the overflow row, nothing is lost.
  for (int m = 0; m < 3000; ++m) {
    c.at(static_cast<ModuleId>(m + 1), 0, MemoryKind::kDevice).on_alloc(m + 1);
    total += m + 1;
  }
  uint64_t seen = 0;
  bool overflow = false;
  c.for_each([&](ModuleId m, int, MemoryKind, const ModuleTotals& mc) {
    seen += mc.snapshot().live_bytes;
    overflow |= m == ModuleCounters::kOverflowModule;
  });
  EXPECT_EQ(seen, total);
  EXPECT_TRUE(overflow);
}

TEST(ModuleCounters, ExactUnderConcurrency) {
  ModuleCounters c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5000; ++i) {
        c.at(static_cast<ModuleId>(1 + i % 16), t % 2, MemoryKind::kDevice).on_alloc(512);
        if (i % 2) c.at(static_cast<ModuleId>(1 + i % 16), t % 2, MemoryKind::kDevice).on_free(512);
      }
    });
  for (auto& t : threads) t.join();
  uint64_t live = 0, allocs = 0, rows = 0;
  c.for_each([&](ModuleId, int, MemoryKind, const ModuleTotals& mc) {
    live += mc.snapshot().live_bytes;
    allocs += mc.snapshot().total_allocs;
    ++rows;
  });
  EXPECT_EQ(rows, 32u);
  EXPECT_EQ(allocs, 8u * 5000);
  EXPECT_EQ(live, 8u * 2500 * 512);
}

TEST(AllocationTracker, KeepsPerModuleTotals) {
  AllocationTracker t;
  AllocationRecord dev;
  dev.size = 4096;
  dev.requested = 4000;
  dev.module = 7;
  AllocationRecord host = dev;
  host.kind = MemoryKind::kHost;
  host.device = 3;  // host memory belongs to no device: one row whatever device was current
  AllocationRecord host2 = host;
  host2.device = 0;
  ASSERT_TRUE(t.insert(0x1000, dev));
  ASSERT_TRUE(t.insert(0x2000, host));
  ASSERT_TRUE(t.insert(0x3000, host2));
  ASSERT_FALSE(t.insert(0x1000, dev));  // already live: not counted again
  ASSERT_TRUE(t.erase(0x2000, nullptr));
  std::map<std::pair<int, int>, ModuleSnapshot> rows;
  t.modules().for_each([&](ModuleId m, int d, MemoryKind k, const ModuleTotals& mc) {
    EXPECT_EQ(m, 7);
    rows[{d, static_cast<int>(k)}] = mc.snapshot();
  });
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ((rows[{0, 0}].live_bytes), 4096u);
  EXPECT_EQ((rows[{0, 0}].total_allocs), 1u);
  const ModuleSnapshot h = rows[{-1, static_cast<int>(MemoryKind::kHost)}];
  EXPECT_EQ(h.live_bytes, 4096u);
  EXPECT_EQ(h.total_allocs, 2u);
  EXPECT_EQ(h.total_frees, 1u);
}

}  // namespace
}  // namespace gpushim
