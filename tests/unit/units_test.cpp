#include "util/units.h"

#include <gtest/gtest.h>
#include "test_sizes.h"

namespace gpushim {
namespace {

constexpr uint64_t kGiB = 1ull << 30, kTiB = 1ull << 40;

bool Parses(const char* text, uint64_t expected) {
  uint64_t v = 0xDEAD;
  if (!parse_bytes(text, &v)) {
    ADD_FAILURE() << "rejected: \"" << text << "\"";
    return false;
  }
  EXPECT_EQ(v, expected) << "\"" << text << "\"";
  return v == expected;
}

void Rejects(const char* text) {
  uint64_t v = 0xDEAD;
  EXPECT_FALSE(parse_bytes(text, &v)) << "accepted: \"" << text << "\" as " << v;
  EXPECT_EQ(v, 0xDEADu) << "output must be untouched on rejection";
}

TEST(ParseBytes, PlainIntegers) {
  Parses("0", 0);
  Parses("4096", 4096);
  Parses("18446744073709551615", UINT64_MAX);
  Parses("000012", 12);
  Parses("12B", 12);
  Parses("12 b", 12);
}

TEST(ParseBytes, BinaryAndDecimalUnits) {
  Parses("8GiB", 8 * kGiB);
  Parses("8gib", 8 * kGiB);
  Parses("8G", 8 * kGiB);
  Parses("8g", 8 * kGiB);
  Parses("8Gi", 8 * kGiB);
  Parses("8GB", 8000000000ull);
  Parses("8gb", 8000000000ull);
  Parses("512k", 512 * kKiB);
  Parses("512KiB", 512 * kKiB);
  Parses("512KB", 512000);
  Parses("3M", 3 * kMiB);
  Parses("3MB", 3000000);
  Parses("2TiB", 2 * kTiB);
  Parses("2TB", 2000000000000ull);
}

TEST(ParseBytes, Whitespace) {
  Parses(" 12 MiB ", 12 * kMiB);
  Parses("\t12MiB\n", 12 * kMiB);
  Rejects("1 2MiB");
  Rejects("12 M iB");
}

TEST(ParseBytes, FractionsAreExact) {
  Parses("1.5GiB", 1610612736ull);
  Parses("1.5GB", 1500000000ull);
  Parses("0.5k", 512);
  Parses("0.25MiB", kMiB / 4);
  // 0.1 GiB = 107374182.4 bytes: truncated to a whole byte, never rounded through a double.
  Parses("0.1GiB", 107374182ull);
  Parses("15.999999999999999999T", 16 * kTiB - 1);  // 18 fraction digits: the most allowed
  Rejects("1.5");   // fractions of a byte
  Rejects("1.5B");
  Rejects(".5G");
  Rejects("1.G");
  Rejects("1.0000000000000000000G");  // 19 fraction digits
  Rejects("1..5G");
  Rejects("1,5G");
}

TEST(ParseBytes, Overflow) {
  Rejects("18446744073709551616");
  Rejects("99999999999999999999999");
  Rejects("99999999999T");
  Rejects("16777216T");  // exactly 2^64
  Parses("16777215T", 16777215ull * kTiB);
  Parses("15.9999999T", 15 * kTiB + 9999999ull * kTiB / 10000000ull);
  Parses("17179869183.999999999G", 17179869183ull * kGiB + (999999999ull * kGiB) / 1000000000ull);
  Rejects("17179869184G");  // 2^64
}

TEST(ParseBytes, RejectsGarbage) {
  Rejects("");
  Rejects("   ");
  Rejects("-1");
  Rejects("-0");
  Rejects("+1");
  Rejects("12 MiBx");
  Rejects("12MiB!");
  Rejects("12X");
  Rejects("12KiBB");
  Rejects("12bytes");
  Rejects("MiB");
  Rejects("0x10");
  Rejects("1e9");
  Rejects("12 Mb extra");
}

TEST(ParseBytes, EmbeddedNulIsJunk) {
  uint64_t v = 0;
  EXPECT_FALSE(parse_bytes(std::string_view("12\0M", 4), &v));
  EXPECT_TRUE(parse_bytes(std::string_view("12M trailing", 3), &v));
  EXPECT_EQ(v, 12 * kMiB);
}

TEST(FormatBytes, HumanUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(12 * kMiB), "12.0 MiB");
  EXPECT_EQ(format_bytes(40 * kMiB + 100), "40.0 MiB");
  EXPECT_EQ(format_bytes(kMiB - 1), "1.0 MiB") << "never \"1024.0 KiB\"";
  EXPECT_EQ(format_bytes(3 * kGiB + kGiB / 5), "3.2 GiB");
  EXPECT_EQ(format_bytes(2 * kTiB), "2.0 TiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "16.0 EiB");
}

TEST(FormatBytes, ParsesBack) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{1023}, uint64_t{1024}, uint64_t{1536}, 12 * kMiB, 5 * kGiB / 2}) {
    uint64_t back = 0;
    const std::string text = format_bytes(v);
    ASSERT_TRUE(parse_bytes(text, &back)) << text;
    if (v < 1024 || v % (kKiB / 2) == 0) {
      EXPECT_EQ(back, v) << text;
    }
  }
}

}  // namespace
}  // namespace gpushim
