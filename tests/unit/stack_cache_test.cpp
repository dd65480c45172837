// The per-thread stack cache (stacks/stack_cache.h) must never answer with another stack than a
// full unwind would: every capture here is compared with one of a capturer whose cache is off
// (same table, so equal stacks get equal ids), in the shapes where a weaker key would be wrong.
// The Python side (a line that changes, the same innermost Python frames under different callers)
// is covered end to end by e2e.python_stacks (repeated_sites.py) on every interpreter.
#include "stacks/stack_cache.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "stacks/native_stack.h"
#include "stacks/stack_capturer.h"

// noinline + noipa: each helper stays a real frame of its own, and GCC's identical-code folding
// cannot merge the two identical callers into one (clang ignores noipa; it has no such folding).
// The loops that compare captures are never unrolled: each capture must come from one call site.
#if defined(__clang__)
#define GPUSHIM_NO_UNROLL _Pragma("clang loop unroll(disable)")
#else
#define GPUSHIM_NO_UNROLL _Pragma("GCC unroll 1")
#endif

namespace gpushim_cachetest {

thread_local gpushim::StackCapturer* t_capturer = nullptr;

__attribute__((noinline, noipa)) gpushim::StackId leaf() {
  const gpushim::StackId id = t_capturer->capture();
  asm volatile("" ::: "memory");
  return id;
}

__attribute__((noinline, noipa)) gpushim::StackId chain(int n) {
  const gpushim::StackId id = n == 0 ? leaf() : chain(n - 1);
  asm volatile("" ::: "memory");
  return id;
}

// Identical bodies, so identical frames: under either, every frame of chain() and leaf() has the
// same return address at the same stack address, and so has the capturing function. Only the
// return address into caller_a or caller_b, 14 frames out, tells the two stacks apart.
__attribute__((noinline, noipa)) gpushim::StackId caller_a() {
  const gpushim::StackId id = chain(12);
  asm volatile("" ::: "memory");
  return id;
}

__attribute__((noinline, noipa)) gpushim::StackId caller_b() {
  const gpushim::StackId id = chain(12);
  asm volatile("" ::: "memory");
  return id;
}

// Two call sites of one function: the same frames above, one return address apart.
__attribute__((noinline, noipa)) void two_sites(gpushim::StackId* first, gpushim::StackId* second) {
  *first = chain(2);
  asm volatile("" ::: "memory");
  *second = chain(2);
  asm volatile("" ::: "memory");
}

}  // namespace gpushim_cachetest

namespace gpushim {
namespace {

using gpushim_cachetest::t_capturer;

struct Capturers {
  StackTable table;
  StackCapturer cached{StackCaptureOptions{32, false, "", 0, 0, true}, &table, nullptr};
  StackCapturer uncached{StackCaptureOptions{32, false, "", 0, 0, false}, &table, nullptr};
};

uint64_t hits_of_this_thread() {
  ThreadStackCache* c = ThreadStackCache::acquire();
  if (c == nullptr) return 0;
  const uint64_t n = c->hits();
  c->release();
  return n;
}

// One call site for both capturers, so that the frames above the helpers are the same.
__attribute__((noinline, noipa)) StackId run(StackCapturer* cap, StackId (*f)()) {
  t_capturer = cap;
  const StackId id = f();
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline, noipa)) StackId run_chain(StackCapturer* cap, int n) {
  t_capturer = cap;
  const StackId id = gpushim_cachetest::chain(n);
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline, noipa)) void run_two_sites(StackCapturer* cap, StackId* first, StackId* second) {
  t_capturer = cap;
  gpushim_cachetest::two_sites(first, second);
  asm volatile("" ::: "memory");
}
// Call i of callers[i % n], with the uncached capturer for the first n calls and the cached one
// after: every call from the same call site, so equal stacks give equal ids.
__attribute__((noinline, noipa)) std::vector<StackId> ids_of(Capturers& c, std::vector<StackId (*)()> callers,
                                                              int calls) {
  std::vector<StackId> ids(static_cast<size_t>(calls));
  const int n = static_cast<int>(callers.size());
  GPUSHIM_NO_UNROLL
  for (int i = 0; i < calls; ++i) {
    StackCapturer* volatile cap = i < n ? &c.uncached : &c.cached;
    ids[i] = run(cap, callers[i % n]);
  }
  return ids;
}

TEST(StackCache, CallersSharingTheInnermostFramesKeepTheirOwnStacks) {
  Capturers c;
  const uint64_t hits_before = hits_of_this_thread();
  // Alternating, so that every capture follows one of the other caller from the same place.
  const auto ids = ids_of(c, {gpushim_cachetest::caller_a, gpushim_cachetest::caller_b}, 42);
  ASSERT_NE(ids[0], kEmptyStack);
  ASSERT_NE(ids[0], ids[1]);
  for (size_t i = 2; i < ids.size(); ++i) EXPECT_EQ(ids[i], ids[i % 2]) << "call " << i;
  // The cache really answered (where it exists: not under ThreadSanitizer, see native_stack.cpp).
  if (native_trace_available()) {
    EXPECT_GE(hits_of_this_thread() - hits_before, 30u);
  }
}

TEST(StackCache, RecursionDepthsStayApart) {
  Capturers c;
  const uint64_t hits_before = hits_of_this_thread();
  constexpr int kDepths = 6;
  std::vector<StackId> ids;
  GPUSHIM_NO_UNROLL
  for (int i = 0; i < 11 * kDepths; ++i) {
    StackCapturer* volatile cap = i < kDepths ? &c.uncached : &c.cached;
    // Up and down: each depth follows a deeper and a shallower one.
    const int n = (i / kDepths) % 2 ? kDepths - 1 - i % kDepths : i % kDepths;
    ids.push_back(run_chain(cap, n));
    if (i >= kDepths) {
      EXPECT_EQ(ids.back(), ids[n]) << "depth " << n << ", call " << i;
    }
  }
  for (int n = 1; n < kDepths; ++n) EXPECT_NE(ids[n], ids[n - 1]);
  if (native_trace_available()) {
    EXPECT_GE(hits_of_this_thread() - hits_before, 40u);
  }
}

TEST(StackCache, TwoCallSitesOfOneFunction) {
  Capturers c;
  StackId first = 0, second = 0;
  GPUSHIM_NO_UNROLL
  for (int i = 0; i < 10; ++i) {
    StackCapturer* volatile cap = i == 0 ? &c.uncached : &c.cached;
    StackId x = 0, y = 0;
    run_two_sites(cap, &x, &y);
    if (i == 0) {
      first = x, second = y;
      ASSERT_NE(first, second);
    }
    EXPECT_EQ(x, first);
    EXPECT_EQ(y, second);
  }
}

TEST(StackCache, EachThreadHasItsOwn) {
  Capturers c;
  std::vector<std::thread> threads;
  std::vector<int> wrong(2, -1);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      // The two threads run the callers in opposite orders.
      const auto ids = t ? ids_of(c, {gpushim_cachetest::caller_a, gpushim_cachetest::caller_b}, 400)
                         : ids_of(c, {gpushim_cachetest::caller_b, gpushim_cachetest::caller_a}, 400);
      wrong[t] = ids[0] == ids[1];
      for (size_t i = 2; i < ids.size(); ++i) wrong[t] += ids[i] != ids[i % 2];
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong[0], 0);
  EXPECT_EQ(wrong[1], 0);
}

TEST(StackCache, LoadingALibraryEmptiesIt) {
  Capturers c;
  ids_of(c, {gpushim_cachetest::caller_a}, 4);
  ThreadStackCache* cache = ThreadStackCache::acquire();
  ASSERT_NE(cache, nullptr);
  // Without libunwind's cursor (ThreadSanitizer builds) capturers never fill the cache.
  EXPECT_EQ(cache->entries() > 0, native_trace_available());
  cache->release();
  void* h = dlopen((std::string(GPUSHIM_FAKECUDA_DIR) + "/libcuda.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  cache = ThreadStackCache::acquire();
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->entries(), 0u);
  cache->release();
  // Left loaded: once unloaded, the simulated driver's static objects show up as leaks under LSan.
}

TEST(StackCache, ACaptureReenteringTheCacheBypassesIt) {
  Capturers c;
  ids_of(c, {gpushim_cachetest::caller_a}, 4);
  ThreadStackCache* outer = ThreadStackCache::acquire();
  ASSERT_NE(outer, nullptr);
  // As a signal handler's capture would find it: in use further down this thread's stack.
  EXPECT_EQ(ThreadStackCache::acquire(), nullptr);
  const uint64_t hits = outer->hits();
  const auto ids = ids_of(c, {gpushim_cachetest::caller_a}, 3);
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
  EXPECT_EQ(outer->hits(), hits);
  outer->release();
}

}  // namespace
}  // namespace gpushim
