// FutexMutex guards every pool: mutual exclusion, and no waiter left behind (a lost wake-up must
// cost at most one bounded sleep, never a hang).
#include "util/futex_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace gpushim {
namespace {

TEST(FutexMutex, ExcludesUnderHeavyContention) {
  FutexMutex mu;
  // Deliberately not atomic: any overlap of two critical sections loses increments (and a
  // ThreadSanitizer build reports the race).
  uint64_t counter = 0;
  uint64_t inside = 0, overlaps = 0;
  constexpr int kThreads = 8;
  constexpr int kRounds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard<FutexMutex> lock(mu);
        if (inside++ != 0) ++overlaps;
        ++counter;
        --inside;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kRounds);
  EXPECT_EQ(overlaps, 0u);
}

TEST(FutexMutex, WaitersSleepingBehindALongHolderAllGetIn) {
  // The holder keeps the lock far longer than the spin phase, so every waiter goes to sleep in
  // the kernel; after the release each must still get in (a hang fails the test by its timeout).
  FutexMutex mu;
  constexpr int kWaiters = 6;
  std::atomic<int> started{0}, done{0};
  mu.lock();
  std::vector<std::thread> threads;
  for (int t = 0; t < kWaiters; ++t)
    threads.emplace_back([&] {
      started.fetch_add(1);
      std::lock_guard<FutexMutex> lock(mu);
      done.fetch_add(1);
    });
  while (started.load() != kWaiters) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(done.load(), 0);
  mu.unlock();
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), kWaiters);
}

TEST(FutexMutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  FutexMutex mu;
  ASSERT_TRUE(mu.try_lock());
  bool other = true;
  std::thread([&] { other = mu.try_lock(); }).join();
  EXPECT_FALSE(other);
  mu.unlock();
  std::thread([&] {
    other = mu.try_lock();
    if (other) mu.unlock();
  }).join();
  EXPECT_TRUE(other);
}

}  // namespace
}  // namespace gpushim
