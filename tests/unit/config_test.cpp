#include "config/config.h"

#include <gtest/gtest.h>

namespace gpushim {
namespace {

ConfigResult parse(std::vector<std::pair<std::string, std::string>> vars) { return parse_config(vars); }

TEST(Config, DefaultsWhenNothingIsSet) {
  const ConfigResult r = parse({{"PATH", "/bin"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.config.stack_depth, 32u);
  EXPECT_TRUE(r.config.report_enabled);
  EXPECT_EQ(r.config.summary_sites, 5u);
}

TEST(Config, PolicyNamesAreCaseInsensitiveAndTrimmed) {
  const ConfigResult r = parse({{"GPUSHIM_POLICY", "  PassThrough \t"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.config.policy, PolicyKind::kPassthrough);
}

TEST(Config, UnknownPolicyIsAnErrorThatSaysWhatIsAccepted) {
  const ConfigResult r = parse({{"GPUSHIM_POLICY", "fastest"}});
  ASSERT_EQ(r.errors.size(), 1u);
  const std::string msg = r.errors[0].message();
  EXPECT_NE(msg.find("GPUSHIM_POLICY"), std::string::npos);
  EXPECT_NE(msg.find("fastest"), std::string::npos);
  EXPECT_NE(msg.find("passthrough"), std::string::npos);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(Config, PoolSettingsUnderPassthroughAreRefusedOneLineEach) {
  const ConfigResult r =
      parse({{"GPUSHIM_POLICY", "passthrough"}, {"GPUSHIM_QUARANTINE", "0"}, {"GPUSHIM_SMALL_SEGMENT", "4MiB"}});
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].variable, "GPUSHIM_QUARANTINE");
  EXPECT_EQ(r.errors[1].variable, "GPUSHIM_SMALL_SEGMENT");
  EXPECT_NE(r.errors[0].message().find("passthrough"), std::string::npos);
  // Saying "not used" is no contradiction; under a pool the same settings are fine.
  EXPECT_TRUE(parse({{"GPUSHIM_POLICY", "passthrough"}, {"GPUSHIM_OWN_SEGMENT_MIN", "off"}}).ok());
  EXPECT_TRUE(parse({{"GPUSHIM_POLICY", "caching"}, {"GPUSHIM_QUARANTINE", "0"}}).ok());
}

// Settings of the other pool are accepted (a job that sweeps GPUSHIM_POLICY keeps its environment)
// and each gets a line saying it does nothing; the shared ones get none.
TEST(Config, SettingsOfTheOtherPoolAreAcceptedWithALineEach) {
  ConfigResult r = parse({{"GPUSHIM_POLICY", "vmm"},
                          {"GPUSHIM_MAX_SPLIT", "64MiB"},
                          {"GPUSHIM_LARGE_SEGMENT", "32MiB"},
                          {"GPUSHIM_QUARANTINE", "0"},
                          {"GPUSHIM_VMM_REUSE", "idle"}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.inert.size(), 2u);
  EXPECT_EQ(r.inert[0].rfind("GPUSHIM_MAX_SPLIT=64MiB has no effect", 0), 0u) << r.inert[0];
  EXPECT_NE(r.inert[0].find("GPUSHIM_POLICY=vmm"), std::string::npos) << r.inert[0];
  EXPECT_EQ(r.inert[1].rfind("GPUSHIM_LARGE_SEGMENT=32MiB has no effect", 0), 0u) << r.inert[1];
  r = parse({{"GPUSHIM_VMM_REUSE", "idle"}, {"GPUSHIM_MAX_SPLIT", "64MiB"}});  // the default policy, caching
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.inert.size(), 1u);
  EXPECT_EQ(r.inert[0], "GPUSHIM_VMM_REUSE=idle has no effect: it sets the vmm policy, and the policy is caching "
                        "(GPUSHIM_POLICY=vmm uses it)");
  EXPECT_TRUE(parse({{"GPUSHIM_POLICY", "vmm"}, {"GPUSHIM_VMM_REUSE", "idle"}}).inert.empty());
  EXPECT_TRUE(parse({{"GPUSHIM_POLICY", "caching"}, {"GPUSHIM_MAX_SPLIT", "64MiB"}}).inert.empty());
  // Under passthrough they are refused, not noted (above).
  EXPECT_TRUE(parse({{"GPUSHIM_POLICY", "passthrough"}, {"GPUSHIM_VMM_REUSE", "idle"}}).inert.empty());
}

// GPUSHIM_EXIT_LEAK_BYTES only sets GPUSHIM_EXIT_CODE's threshold: alone it does nothing, and says so.
TEST(Config, ALeakThresholdWithoutAnExitCodeGetsALine) {
  ConfigResult r = parse({{"GPUSHIM_EXIT_LEAK_BYTES", "1MiB"}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.inert.size(), 1u);
  EXPECT_EQ(r.inert[0], "GPUSHIM_EXIT_LEAK_BYTES=1MiB has no effect: it is the live-memory threshold of "
                        "GPUSHIM_EXIT_CODE, which is off (set GPUSHIM_EXIT_CODE to an exit status)");
  EXPECT_TRUE(parse({{"GPUSHIM_EXIT_LEAK_BYTES", "1MiB"}, {"GPUSHIM_EXIT_CODE", "3"}}).inert.empty());
  EXPECT_TRUE(parse({{"GPUSHIM_EXIT_LEAK_BYTES", "off"}}).inert.empty());
}

TEST(Config, SmallSegmentAboveLargeSegmentIsRefused) {
  const ConfigResult r = parse({{"GPUSHIM_SMALL_SEGMENT", "32MiB"}, {"GPUSHIM_LARGE_SEGMENT", "16MiB"}});
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].message(), "GPUSHIM_SMALL_SEGMENT='32MiB' is invalid: expected at most GPUSHIM_LARGE_SEGMENT (16MiB)");
  EXPECT_FALSE(parse({{"GPUSHIM_SMALL_SEGMENT", "32MiB"}}).ok());  // above the default 20MiB
  EXPECT_TRUE(parse({{"GPUSHIM_SMALL_SEGMENT", "16MiB"}, {"GPUSHIM_LARGE_SEGMENT", "16MiB"}}).ok());
}

// As PyTorch's max_split_size_mb must exceed its 20 MB segments: at or below the large segment,
// every medium request would hold a segment of its own (caching_pool.cpp).
TEST(Config, MaxSplitAtOrBelowTheLargeSegmentIsRefused) {
  const ConfigResult r = parse({{"GPUSHIM_MAX_SPLIT", "20MiB"}});
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].message(),
            "GPUSHIM_MAX_SPLIT='20MiB' is invalid: expected more than GPUSHIM_LARGE_SEGMENT (20MiB), or none, as "
            "PyTorch's max_split_size_mb must exceed its 20 MB segments");
  EXPECT_FALSE(parse({{"GPUSHIM_MAX_SPLIT", "4MiB"}}).ok());
  // With a segment size of the user's own, the reason is that size, not PyTorch's 20 MB.
  const ConfigResult own = parse({{"GPUSHIM_MAX_SPLIT", "30MiB"}, {"GPUSHIM_LARGE_SEGMENT", "32MiB"}});
  ASSERT_EQ(own.errors.size(), 1u);
  EXPECT_EQ(own.errors[0].message(),
            "GPUSHIM_MAX_SPLIT='30MiB' is invalid: expected more than GPUSHIM_LARGE_SEGMENT (32MiB), or none: a free "
            "block that large is never split, so each large segment would serve one request");
  const ConfigResult ok = parse({{"GPUSHIM_MAX_SPLIT", "22MiB"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.config.max_split, 22ull << 20);
  EXPECT_TRUE(parse({{"GPUSHIM_MAX_SPLIT", "40MiB"}, {"GPUSHIM_LARGE_SEGMENT", "32MiB"}}).ok());
  EXPECT_TRUE(parse({{"GPUSHIM_MAX_SPLIT", "none"}}).ok());
}

TEST(Config, StackDepthBounds) {
  EXPECT_EQ(parse({{"GPUSHIM_STACK_DEPTH", "0"}}).config.stack_depth, 0u);
  EXPECT_EQ(parse({{"GPUSHIM_STACK_DEPTH", "256"}}).config.stack_depth, 256u);
  for (const char* bad : {"", "-1", "257", "12x", "1e3", "99999999999999999999999", " "})
    EXPECT_FALSE(parse({{"GPUSHIM_STACK_DEPTH", bad}}).ok()) << "'" << bad << "'";
}

TEST(Config, ReportOffAndTemplate) {
  EXPECT_FALSE(parse({{"GPUSHIM_REPORT", "off"}}).config.report_enabled);
  EXPECT_FALSE(parse({{"GPUSHIM_REPORT", "OFF"}}).config.report_enabled);
  const ConfigResult r = parse({{"GPUSHIM_REPORT", "/tmp/r.%p.%r.json"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.config.report_template, "/tmp/r.%p.%r.json");
  EXPECT_FALSE(parse({{"GPUSHIM_REPORT", ""}}).ok());
}

TEST(Config, UnknownGpushimVariableIsAnError) {
  const ConfigResult r = parse({{"GPUSHIM_STAK_DEPTH", "8"}});
  ASSERT_EQ(r.errors.size(), 1u);
  const std::string msg = r.errors[0].message();
  EXPECT_NE(msg.find("GPUSHIM_STAK_DEPTH"), std::string::npos);
  EXPECT_NE(msg.find("GPUSHIM_STACK_DEPTH"), std::string::npos) << "lists the known names: " << msg;
}

TEST(Config, EnvironArrayForm) {
  const char* env[] = {"HOME=/root", "GPUSHIM_SUMMARY=0", "GPUSHIM_STACK_DEPTH=4", nullptr};
  const ConfigResult r = parse_config(env);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.config.summary_sites, 0u);
  EXPECT_EQ(r.config.stack_depth, 4u);
}

TEST(Config, EveryVariableIsDocumented) {
  for (const ConfigVariableDoc& d : config_variable_docs()) {
    EXPECT_EQ(d.name.rfind("GPUSHIM_", 0), 0u);
    EXPECT_FALSE(d.accepted.empty()) << d.name;
    EXPECT_FALSE(d.default_value.empty()) << d.name;
    EXPECT_FALSE(d.description.empty()) << d.name;
  }
}

}  // namespace
}  // namespace gpushim
