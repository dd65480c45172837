// The device budget: the cap is checked against memory held plus memory being asked for, while
// "reserved" and its peak count only what the driver actually gave.
#include "policy/device_budget.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>
#include "test_sizes.h"

namespace gpushim {
namespace {


TEST(DeviceBudget, ARefusedRequestNeverShowsInReservedOrItsPeak) {
  DeviceBudget b;
  ASSERT_TRUE(b.try_charge(100 * MiB));
  b.commit(100 * MiB);
  ASSERT_TRUE(b.try_charge(64 * MiB));  // the driver is asked ...
  EXPECT_EQ(b.charged(), 164 * MiB);    // ... and the cap sees the request in flight,
  EXPECT_EQ(b.held(), 100 * MiB);       // but reserved does not,
  b.cancel(64 * MiB);                   // ... and the driver says no.
  EXPECT_EQ(b.held(), 100 * MiB);
  EXPECT_EQ(b.charged(), 100 * MiB);
  EXPECT_EQ(b.peak(), 100 * MiB);
  b.uncharge(100 * MiB);
  EXPECT_EQ(b.held(), 0u);
  EXPECT_EQ(b.charged(), 0u);
  EXPECT_EQ(b.peak(), 100 * MiB);
}

// CUDA's ReservedMemHigh: reset to the current figure by the program, while the report's peak
// stays the whole run's.
TEST(DeviceBudget, TheWindowPeakResetsToWhatIsHeldAndThePeakNever) {
  DeviceBudget b;
  b.charge(100 * MiB);
  b.charge(50 * MiB);
  b.uncharge(120 * MiB);
  EXPECT_EQ(b.window_peak(), 150 * MiB);
  b.reset_window_peak();
  EXPECT_EQ(b.window_peak(), 30 * MiB);
  b.charge(10 * MiB);
  EXPECT_EQ(b.window_peak(), 40 * MiB);
  EXPECT_EQ(b.peak(), 150 * MiB);
}

TEST(DeviceBudget, RequestsInFlightCountAgainstTheCap) {
  DeviceBudget b;
  b.set_limit(100 * MiB);
  ASSERT_TRUE(b.try_charge(60 * MiB));
  EXPECT_FALSE(b.try_charge(60 * MiB));  // the first is not committed yet, but it is asked for
  b.cancel(60 * MiB);
  EXPECT_TRUE(b.try_charge(60 * MiB));
}

// What CUDA's own pools keep beyond their allocations is held from the driver: it leaves less for
// the driver to give under the cap, but a request to such a pool may be served out of it.
TEST(DeviceBudget, WhatIsHeldBesideTheBudgetCountsAgainstTheCapExceptForItsOwnPools) {
  DeviceBudget b;
  b.set_limit(256 * MiB);
  b.charge(200 * MiB);
  b.set_beside(128 * MiB, /*whole=*/true);
  EXPECT_EQ(b.room(), 0u);
  EXPECT_FALSE(b.try_charge(50 * MiB));
  EXPECT_FALSE(b.try_charge(1));
  EXPECT_TRUE(b.try_charge(50 * MiB, /*from_beside=*/true));  // 200 + 50 under the cap
  b.cancel(50 * MiB);
  b.set_beside(40 * MiB, /*whole=*/true);
  EXPECT_EQ(b.room(), 16 * MiB);
  EXPECT_FALSE(b.try_charge(17 * MiB));
  EXPECT_TRUE(b.try_charge(16 * MiB));
  b.cancel(16 * MiB);
  b.set_beside(300 * MiB, /*whole=*/true);  // more than the cap: no wrap-around
  EXPECT_FALSE(b.try_charge(1));
  EXPECT_EQ(b.room(), 0u);
  b.set_limit(0);
  EXPECT_EQ(b.room(), UINT64_MAX);
  EXPECT_TRUE(b.try_charge(1024 * MiB));
}

TEST(DeviceBudget, MemoryTakenBeforeItsSizeWasKnownCountsPastTheCap) {
  DeviceBudget b;
  b.set_limit(10 * MiB);
  b.charge(16 * MiB);
  EXPECT_EQ(b.held(), 16 * MiB);
  EXPECT_EQ(b.peak(), 16 * MiB);
  EXPECT_FALSE(b.try_charge(1));
}

TEST(DeviceBudget, ConcurrentCallersNeverOvershootTheCapTogether) {
  DeviceBudget b;
  b.set_limit(64 * MiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (!b.try_charge(3 * MiB)) continue;
        b.commit(3 * MiB);
        b.uncharge(3 * MiB);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_LE(b.peak(), 64 * MiB);
  EXPECT_EQ(b.held(), 0u);
  EXPECT_EQ(b.charged(), 0u);
}

}  // namespace
}  // namespace gpushim
