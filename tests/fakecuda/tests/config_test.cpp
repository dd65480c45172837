// Parsing of the FAKECUDA_* environment variables (driver/config.cpp is compiled into the test) and
// the end-to-end effect of the variables on a fresh process.
#include <cstring>

#include "../driver/config.h"
#include "test_util.h"

namespace fakecuda_test {
namespace {

using fakecuda::Config;
using fakecuda::LoadConfig;
using fakecuda::ParseIndexList;
using fakecuda::ParseSize;

TEST(ConfigParse, SizesWithUnits) {
  EXPECT_EQ(ParseSize("16GiB"), std::size_t{16} << 30);
  EXPECT_EQ(ParseSize("512MiB"), std::size_t{512} << 20);
  EXPECT_EQ(ParseSize("1G"), std::size_t{1} << 30);
  EXPECT_EQ(ParseSize("1g"), std::size_t{1} << 30);
  EXPECT_EQ(ParseSize("64k"), std::size_t{64} << 10);
  EXPECT_EQ(ParseSize("4096"), 4096u);
  EXPECT_EQ(ParseSize(" 2 MiB "), std::size_t{2} << 20);
  EXPECT_EQ(ParseSize("1.5GiB"), std::size_t{3} << 29);
  EXPECT_EQ(ParseSize("1GB"), 1000000000u);
  EXPECT_EQ(ParseSize("2MB"), 2000000u);
  EXPECT_EQ(ParseSize("1T"), std::size_t{1} << 40);
}

TEST(ConfigParse, RejectsMalformedSizes) {
  EXPECT_FALSE(ParseSize(""));
  EXPECT_FALSE(ParseSize("GiB"));
  EXPECT_FALSE(ParseSize("12 parsecs"));
  EXPECT_FALSE(ParseSize("-1G"));
  EXPECT_FALSE(ParseSize("1..5G"));
  EXPECT_FALSE(ParseSize("99999999999999999999"));
  EXPECT_FALSE(ParseSize("100000000000T"));  // overflows size_t
}

TEST(ConfigParse, IndexLists) {
  EXPECT_EQ(ParseIndexList("3"), (std::set<std::uint64_t>{3}));
  EXPECT_EQ(ParseIndexList("3,7"), (std::set<std::uint64_t>{3, 7}));
  EXPECT_EQ(ParseIndexList(" 1 , 12 ,5"), (std::set<std::uint64_t>{1, 5, 12}));
  EXPECT_FALSE(ParseIndexList(""));
  EXPECT_FALSE(ParseIndexList("0"));  // 1-based
  EXPECT_FALSE(ParseIndexList("3,"));
  EXPECT_FALSE(ParseIndexList("x"));
  EXPECT_FALSE(ParseIndexList("-2"));
}

// LoadConfig with a fake environment.
std::map<std::string, std::string>* g_env = nullptr;
const char* FakeGetenv(const char* name) {
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

Config Load(std::map<std::string, std::string> env, std::string* err) {
  g_env = &env;
  Config c = LoadConfig(FakeGetenv, err);
  g_env = nullptr;
  return c;
}

TEST(ConfigLoad, Defaults) {
  std::string err;
  Config c = Load({}, &err);
  EXPECT_EQ(c.devices, 1);
  EXPECT_EQ(c.capacity, std::size_t{16} << 30);
  EXPECT_TRUE(c.fail_alloc.empty());
  EXPECT_EQ(c.context_mem, 0u);
  EXPECT_EQ(c.kernel_us, fakecuda::kDefaultKernelUs);
  EXPECT_EQ(err, "");
}

TEST(ConfigLoad, KernelDuration) {
  std::string err;
  EXPECT_EQ(Load({{"FAKECUDA_KERNEL_US", "0"}}, &err).kernel_us, 0u);
  EXPECT_EQ(Load({{"FAKECUDA_KERNEL_US", "250"}}, &err).kernel_us, 250u);
  EXPECT_EQ(err, "");
  EXPECT_EQ(Load({{"FAKECUDA_KERNEL_US", "2000000"}}, &err).kernel_us, fakecuda::kDefaultKernelUs);
  EXPECT_EQ(Load({{"FAKECUDA_KERNEL_US", "soon"}}, &err).kernel_us, fakecuda::kDefaultKernelUs);
  EXPECT_NE(err.find("fakecuda: ignoring FAKECUDA_KERNEL_US"), std::string::npos) << err;
}

TEST(ConfigLoad, AllocationOrder) {
  std::string err;
  EXPECT_FALSE(Load({}, &err).alloc_top_down);
  EXPECT_FALSE(Load({{"FAKECUDA_ALLOC_ORDER", "up"}}, &err).alloc_top_down);
  EXPECT_TRUE(Load({{"FAKECUDA_ALLOC_ORDER", "down"}}, &err).alloc_top_down);
  EXPECT_EQ(err, "");
  EXPECT_FALSE(Load({{"FAKECUDA_ALLOC_ORDER", "sideways"}}, &err).alloc_top_down);
  EXPECT_NE(err.find("fakecuda: ignoring FAKECUDA_ALLOC_ORDER"), std::string::npos) << err;
}

TEST(ConfigLoad, AllVariables) {
  std::string err;
  Config c = Load({{"FAKECUDA_DEVICES", "4"},
                   {"FAKECUDA_MEM", "512MiB"},
                   {"FAKECUDA_FAIL_ALLOC", "3,7"},
                   {"FAKECUDA_CONTEXT_MEM", "300MiB"}},
                  &err);
  EXPECT_EQ(c.devices, 4);
  EXPECT_EQ(c.capacity, std::size_t{512} << 20);
  EXPECT_EQ(c.fail_alloc, (std::set<std::uint64_t>{3, 7}));
  EXPECT_EQ(c.context_mem, std::size_t{300} << 20);
  EXPECT_EQ(err, "");
}

TEST(ConfigLoad, InvalidValuesAreReportedAndDefaulted) {
  std::string err;
  Config c = Load({{"FAKECUDA_DEVICES", "0"},
                   {"FAKECUDA_MEM", "lots"},
                   {"FAKECUDA_FAIL_ALLOC", "first"},
                   {"FAKECUDA_CONTEXT_MEM", "-5"}},
                  &err);
  EXPECT_EQ(c.devices, 1);
  EXPECT_EQ(c.capacity, std::size_t{16} << 30);
  EXPECT_TRUE(c.fail_alloc.empty());
  EXPECT_EQ(c.context_mem, 0u);
  for (const char* var : {"FAKECUDA_DEVICES", "FAKECUDA_MEM", "FAKECUDA_FAIL_ALLOC", "FAKECUDA_CONTEXT_MEM"}) {
    EXPECT_NE(err.find(std::string("fakecuda: ignoring ") + var), std::string::npos) << err;
  }
  EXPECT_FALSE(Load({{"FAKECUDA_DEVICES", "65"}}, &err).devices == 65);
  EXPECT_EQ(Load({{"FAKECUDA_MEM", "1MiB"}}, &err).capacity, std::size_t{16} << 30);  // below one granule
}

// The real environment is read once per process: check it through fresh processes.
TEST(ConfigEnvironment, AppliesToAFreshProcess) {
  ChildResult r = RunChild({"--child=print-config"}, {{"FAKECUDA_DEVICES", "3"}, {"FAKECUDA_MEM", "64MiB"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("devices=3 total=67108864 "), std::string::npos) << r.output;
}

// Freed memory stays in memory while little lies free (the next allocation there does not fault
// every page in again), and goes back to the system past a quarter of the capacity.
TEST(ConfigEnvironment, FreedMemoryStaysInMemoryUpToAQuarterOfTheDevice) {
  ChildResult r = RunChild({"--child=arena-residency"}, {{"FAKECUDA_MEM", "256MiB"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  double kept = -1, past = -1;
  int same = -1;
  ASSERT_EQ(std::sscanf(r.output.c_str(), "same_address=%d kept=%lf past_budget=%lf", &same, &kept, &past), 3) << r.output;
  EXPECT_EQ(same, 1) << r.output;  // first fit: the second block starts where the first was
  EXPECT_GT(kept, 0.99) << r.output;
  EXPECT_EQ(past, 0) << r.output;
}

TEST(ConfigEnvironment, ContextMemoryIsChargedWhenTheContextStarts) {
  ChildResult r = RunChild({"--child=print-config"}, {{"FAKECUDA_MEM", "1GiB"}, {"FAKECUDA_CONTEXT_MEM", "300MiB"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("total=1073741824 free=759169024"), std::string::npos) << r.output;
}

TEST(ConfigEnvironment, InvalidValueIsReportedOnStderr) {
  ChildResult r = RunChild({"--child=print-config"}, {{"FAKECUDA_MEM", "huge"}, {"FAKECUDA_DEVICES", "x"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fakecuda: ignoring FAKECUDA_MEM=\"huge\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fakecuda: ignoring FAKECUDA_DEVICES=\"x\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("devices=1 total=17179869184 "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fakecuda_test
