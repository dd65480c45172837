// Tricky values for every GPUSHIM_* variable: whatever the environment holds, parsing never
// crashes, and each rejected value yields exactly one clear, single-line, bounded message.
// (The libFuzzer target in tests/fuzz/ explores the same parser without a list.)
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace gpushim {
namespace {

ConfigResult parse1(const std::string& name, const std::string& value) {
  return parse_config(std::vector<std::pair<std::string, std::string>>{{name, value}});
}

// A message a person can read on one terminal line: printable ASCII only, bounded.
void ExpectReadable(const std::string& msg) {
  EXPECT_LT(msg.size(), 900u) << msg.substr(0, 200);
  for (char c : msg) ASSERT_TRUE(c >= 0x20 && c < 0x7f) << "control or non-ASCII byte in: " << msg.substr(0, 200);
}

const std::vector<std::string>& TrickyValues() {
  static const std::vector<std::string> values = {
      "", " ", "\t", "  \t ", "0", "-0", "-1", "+1", "1", "01", "1.", ".5", "1e3", "0x10", "NaN", "inf", "-inf",
      "99999999999999999999999", "18446744073709551615", "18446744073709551616", "340282366920938463463374607431768211456",
      "17179869184GiB", "16EiB", "1.5", "1.5GiB", "8gib", "8GIB", "8 GiB", " 8GiB ", "8GiBs", "8G iB", "8iB",
      "60%", "0%", "100%", "101%", "60.5%", "%", "-5%", "off", "OFF", "Off ", "none", "NONE", "on", "true",
      "caching", "caching   ", "  PASSTHROUGH\t", "cach ing", "caching\n", "vmmm", "passthrough,caching",
      "every:3", "nth:0", "random:0.5,seed:1", "above:1GiB", "%p", "/tmp/%p.%h.%r.json", "dir/",
      std::string("12\0" "34", 5), std::string(1, '\0'), "\x1b[31mred", "\xff\xfe", "caf\xc3\xa9",
      std::string(100000, '9'), std::string(1 << 20, 'x') + "GiB"};
  return values;
}

TEST(ConfigTricky, EveryVariableSurvivesEveryValueWithOneClearError) {
  for (const ConfigVariableDoc& doc : config_variable_docs()) {
    for (const std::string& value : TrickyValues()) {
      const ConfigResult r = parse1(doc.name, value);
      if (r.ok()) continue;
      ASSERT_EQ(r.errors.size(), 1u) << doc.name;
      const std::string msg = r.errors[0].message();
      EXPECT_EQ(msg.rfind(doc.name + "='", 0), 0u) << msg.substr(0, 200);
      EXPECT_NE(msg.find("' is invalid: expected " + doc.accepted), std::string::npos) << msg.substr(0, 200);
      ExpectReadable(msg);
    }
  }
}

TEST(ConfigTricky, EmptyAndBlankAreRejectedEverywhere) {
  for (const ConfigVariableDoc& doc : config_variable_docs())
    for (const char* blank : {"", " ", "\t"}) EXPECT_FALSE(parse1(doc.name, blank).ok()) << doc.name << " '" << blank << "'";
}

TEST(ConfigTricky, ControlBytesAndHugeValuesAreShownEscapedAndCut) {
  const std::string msg = parse1("GPUSHIM_STACK_DEPTH", "1\n2\x1b[0m").errors.at(0).message();
  EXPECT_NE(msg.find("'1\\x0a2\\x1b[0m'"), std::string::npos) << msg;
  const std::string huge = parse1("GPUSHIM_LIMIT", std::string(1 << 20, '7') + "XB").errors.at(0).message();
  ExpectReadable(huge);
  EXPECT_NE(huge.find("... (1048578 bytes)"), std::string::npos) << huge.substr(0, 300);
  const std::string nul = parse1("GPUSHIM_SAMPLE_MS", std::string("12\0" "34", 5)).errors.at(0).message();
  EXPECT_NE(nul.find("12\\x0034"), std::string::npos) << nul;
}

TEST(ConfigTricky, NegativeOverflowAndJunkNumbersAreRejected) {
  for (const char* name : {"GPUSHIM_STACK_DEPTH", "GPUSHIM_SUMMARY", "GPUSHIM_SAMPLE_MS", "GPUSHIM_LIMIT",
                           "GPUSHIM_QUARANTINE", "GPUSHIM_ROUND"})
    for (const char* bad : {"-1", "+1", "0x10", "1e3", "99999999999999999999999", "18446744073709551616", "NaN", "1.",
                            ".5"})
      EXPECT_FALSE(parse1(name, bad).ok()) << name << "=" << bad;
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "17179869184GiB").ok()) << "2^64 bytes overflows";
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "16EiB").ok());
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "-5%").ok());
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "101%").ok());
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "60.5%").ok());
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "0").ok());
  // A number without its unit is bytes: below 1 MiB nothing fits, so it was meant otherwise.
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "8").ok());
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "1048575").ok());
  EXPECT_EQ(parse1("GPUSHIM_LIMIT", "1048576").config.limit.bytes, 1048576u);
  EXPECT_EQ(parse1("GPUSHIM_LIMIT", "1MiB").config.limit.bytes, 1048576u);
  EXPECT_FALSE(parse1("GPUSHIM_LIMIT", "0%").ok());
  // A percentage out of range is told the range, not only that percentages exist.
  EXPECT_NE(parse1("GPUSHIM_LIMIT", "150%").errors.at(0).message().find("a whole percentage of capacity from 1% to 100%"),
            std::string::npos);
}

TEST(ConfigTricky, UnitsInAnyCase) {
  for (const char* v : {"8GiB", "8gib", "8GIB", "8Gi", "8g", "8G", "8 GiB", " 8GiB\t"}) {
    const ConfigResult r = parse1("GPUSHIM_LIMIT", v);
    ASSERT_TRUE(r.ok()) << v;
    EXPECT_EQ(r.config.limit.bytes, 8ull << 30) << v;
  }
  for (const char* v : {"8GB", "8gb", "8Gb"}) EXPECT_EQ(parse1("GPUSHIM_LIMIT", v).config.limit.bytes, 8000000000ull) << v;
  EXPECT_EQ(parse1("GPUSHIM_LIMIT", "1.5GiB").config.limit.bytes, 1610612736ull);
  EXPECT_EQ(parse1("GPUSHIM_ROUND", "1kib").config.round_bytes, 1024u);
  EXPECT_EQ(parse1("GPUSHIM_QUARANTINE", "1TiB").config.quarantine_bytes, 1ull << 40);
  EXPECT_FALSE(parse1("GPUSHIM_QUARANTINE", "1.0001TiB").ok());
  EXPECT_EQ(parse1("GPUSHIM_MAX_SPLIT", "NONE").config.max_split, UINT64_MAX);
  EXPECT_DOUBLE_EQ(parse1("GPUSHIM_LIMIT", " 60% ").config.limit.percent, 60.0);
}

TEST(ConfigTricky, PolicyNameWithSpacesAndCase) {
  EXPECT_EQ(parse1("GPUSHIM_POLICY", "caching   ").config.policy, PolicyKind::kCaching);
  EXPECT_EQ(parse1("GPUSHIM_POLICY", "\t  PassThrough ").config.policy, PolicyKind::kPassthrough);
  for (const char* bad : {"cach ing", "caching,passthrough", "caching\n", "cachingg", "pass-through", "\"caching\""})
    EXPECT_FALSE(parse1("GPUSHIM_POLICY", bad).ok()) << bad;
}

TEST(ConfigTricky, UnknownKeysAreNamedAndListTheKnownOnes) {
  for (const std::string& name : {std::string("GPUSHIM_POLCY"), std::string("GPUSHIM_"), std::string("GPUSHIM_policy"),
                                  std::string("GPUSHIM_POLICY "), std::string("GPUSHIM_\x1b[2J"),
                                  "GPUSHIM_" + std::string(5000, 'Z')}) {
    const ConfigResult r = parse1(name, "1");
    ASSERT_EQ(r.errors.size(), 1u) << name.substr(0, 40);
    EXPECT_TRUE(r.errors[0].unknown_name);
    const std::string msg = r.errors[0].message();
    EXPECT_NE(msg.find("is not a gpushim variable (known: GPUSHIM_POLICY, "), std::string::npos) << msg.substr(0, 200);
    ExpectReadable(msg);
  }
  // Other prefixes are not ours and are ignored.
  EXPECT_TRUE(parse1("GPUSHIMX", "1").ok());
  EXPECT_TRUE(parse1("gpushim_policy", "x").ok());
}

TEST(ConfigTricky, EachBadVariableIsItsOwnError) {
  const ConfigResult r = parse_config(std::vector<std::pair<std::string, std::string>>{
      {"GPUSHIM_POLICY", "fast"}, {"GPUSHIM_STACK_DEPTH", "8"}, {"GPUSHIM_LIMIT", "lots"}, {"GPUSHIM_NOPE", "1"}});
  ASSERT_EQ(r.errors.size(), 3u);
  EXPECT_EQ(r.errors[0].variable, "GPUSHIM_POLICY");
  EXPECT_EQ(r.errors[1].variable, "GPUSHIM_LIMIT");
  EXPECT_EQ(r.errors[2].variable, "GPUSHIM_NOPE");
}

}  // namespace
}  // namespace gpushim
