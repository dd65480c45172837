#include "policy/fault_injector.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "config/config.h"

namespace gpushim {
namespace {

FaultSpec spec(const char* text) {
  FaultSpec s;
  EXPECT_TRUE(parse_fault_spec(text, &s)) << text;
  return s;
}

// The numbers (1-based) of the allocations among the first `n` that fail, all of `size` bytes.
std::vector<uint64_t> failing(const char* text, uint64_t n, uint64_t size = 4096) {
  FaultInjector f(spec(text));
  std::vector<uint64_t> out;
  for (uint64_t i = 1; i <= n; ++i)
    if (uint64_t number = f.select(size)) {
      EXPECT_EQ(number, i);
      out.push_back(number);
    }
  EXPECT_EQ(f.counted(), n);
  EXPECT_EQ(f.injected(), out.size());
  return out;
}

TEST(FaultSpec, AcceptedForms) {
  EXPECT_EQ(spec("nth:5").nth, std::vector<uint64_t>{5});
  EXPECT_EQ(spec(" NTH : 5 , nth:9 ").nth, (std::vector<uint64_t>{5, 9}));
  EXPECT_EQ(spec("every:3").every, 3u);
  EXPECT_DOUBLE_EQ(spec("random:0.25").probability, 0.25);
  EXPECT_EQ(spec("random:0.25").seed, 1u);
  EXPECT_EQ(spec("random:0.25,seed:0").seed, 0u);
  EXPECT_EQ(spec("seed:42,random:1").seed, 42u);
  EXPECT_EQ(spec("above:1GiB").above, 1ull << 30);
  EXPECT_EQ(spec("above:0").above, 0u);
  const FaultSpec all = spec("every:10,above:64MiB,nth:1");
  EXPECT_EQ(all.every, 10u);
  EXPECT_EQ(all.above, 64ull << 20);
  EXPECT_EQ(all.text, "every:10,above:64MiB,nth:1");
  for (const char* off : {"off", "OFF", " none ", "0"}) {
    FaultSpec s = spec("every:2");
    ASSERT_TRUE(parse_fault_spec(off, &s)) << off;
    EXPECT_FALSE(s.active()) << off;
  }
}

TEST(FaultSpec, RejectedForms) {
  for (const char* bad :
       {"", " ", "nth", "nth:", "nth:0", "nth:-1", "nth:1.5", "nth:99999999999999999999999", "every:0", "every:x",
        "every:2,every:3", "random:0", "random:1.5", "random:-0.1", "random:.5", "random:0.5.1", "random:nan",
        "random:inf", "random:1e-3", "random:0.1,random:0.2", "seed:3", "seed:3,nth:2", "random:0.1,seed:-1",
        "random:0.1,seed:1,seed:2", "above:", "above:-1", "above:1XB", "above:99999999999999999999TiB",
        "above:18446744073709551615", "every:3,", ",every:3", "every:3,,nth:2", "often:3", "nth=3", "nth 3",
        "every:3;nth:2"}) {
    FaultSpec s = spec("nth:7");
    EXPECT_FALSE(parse_fault_spec(bad, &s)) << "'" << bad << "'";
    EXPECT_EQ(s.nth, std::vector<uint64_t>{7}) << "a rejected spec leaves the old one untouched: " << bad;
  }
  std::string many;
  for (int i = 1; i <= 65; ++i) many += (i > 1 ? ",nth:" : "nth:") + std::to_string(i);
  FaultSpec s;
  EXPECT_FALSE(parse_fault_spec(many, &s)) << "more than 64 nth clauses";
}

TEST(FaultSpec, ConfigTableCarriesIt) {
  const ConfigResult ok = parse_config(std::vector<std::pair<std::string, std::string>>{{"GPUSHIM_FAIL", "every:4"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.config.fail.every, 4u);
  EXPECT_FALSE(Config{}.fail.active()) << "off by default";
  const ConfigResult bad = parse_config(std::vector<std::pair<std::string, std::string>>{{"GPUSHIM_FAIL", "every"}});
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].message().find("GPUSHIM_FAIL='every' is invalid: expected"), std::string::npos)
      << bad.errors[0].message();
}

TEST(FaultInjector, NthFailsExactlyThoseAllocations) {
  EXPECT_EQ(failing("nth:5", 20), std::vector<uint64_t>{5});
  EXPECT_EQ(failing("nth:1,nth:20,nth:7", 20), (std::vector<uint64_t>{1, 7, 20}));
  EXPECT_EQ(failing("nth:21", 20), std::vector<uint64_t>{});
}

TEST(FaultInjector, EveryNth) {
  EXPECT_EQ(failing("every:3", 10), (std::vector<uint64_t>{3, 6, 9}));
  EXPECT_EQ(failing("every:1", 4), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(FaultInjector, RandomIsReproducibleAndHasTheRightRate) {
  const auto a = failing("random:0.1,seed:7", 100000);
  EXPECT_EQ(a, failing("random:0.1,seed:7", 100000)) << "same seed, same failures";
  EXPECT_NE(a, failing("random:0.1,seed:8", 100000)) << "another seed, other failures";
  // Binomial(100000, 0.1): mean 10000, sd ~95; 6 sd either way.
  EXPECT_GT(a.size(), 9430u);
  EXPECT_LT(a.size(), 10570u);
  const auto rare = failing("random:0.0001,seed:3", 1000000);
  EXPECT_GT(rare.size(), 40u);  // mean 100, sd 10
  EXPECT_LT(rare.size(), 160u);
  EXPECT_EQ(failing("random:1", 50).size(), 50u);
}

TEST(FaultInjector, AboveASize) {
  FaultInjector f(spec("above:1MiB"));
  EXPECT_EQ(f.select(1 << 20), 0u) << "exactly the threshold passes";
  EXPECT_EQ(f.select((1 << 20) + 1), 2u);
  EXPECT_EQ(f.select(1), 0u);
  EXPECT_EQ(f.select(UINT64_MAX), 4u);
  EXPECT_EQ(f.injected(), 2u);
}

TEST(FaultInjector, ClausesCombine) {
  FaultInjector f(spec("every:4,above:100,nth:1"));
  std::vector<uint64_t> got;
  const uint64_t sizes[] = {10, 10, 200, 10, 10, 10, 10, 10};
  for (uint64_t s : sizes)
    if (uint64_t n = f.select(s)) got.push_back(n);
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 3, 4, 8}));
}

TEST(FaultInjector, InactiveCountsNothing) {
  FaultInjector f{FaultSpec{}};
  EXPECT_FALSE(f.active());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(f.select(1ull << 40), 0u);
  EXPECT_EQ(f.counted(), 0u);
}

TEST(FaultInjector, ExactUnderConcurrency) {
  FaultInjector f(spec("every:10"));
  std::vector<std::thread> threads;
  std::atomic<uint64_t> failed{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i)
        if (f.select(64)) failed++;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(f.counted(), 80000u);
  EXPECT_EQ(failed.load(), 8000u);
  EXPECT_EQ(f.injected(), 8000u);
}

}  // namespace
}  // namespace gpushim
