// Names gpushim-analyze prints come from a program's symbols and paths, or a damaged input: each
// text line stays one line and sends the terminal nothing but text.
#include <gtest/gtest.h>

#include <string>

#include "offline_symbolizer.h"
#include "report_reader.h"
#include "util/text.h"

namespace gpushim::analysis {
namespace {

TEST(Printable, AFramesControlBytesAreShownAsQuestionMarks) {
  // A trace whose Python file was named "\x1b[31mRED\x1b[0m\nfake line\a" turned summary's frame
  // red, broke it over two lines and rang the bell.
  FrameInfo f;
  f.python = true;
  f.function = "step\x1b[2J";
  f.file = "/job/\x1b[31mRED\x1b[0m\nfake line\a.py";
  f.line = 3;
  EXPECT_EQ(describe_frame(f), "step?[2J ?[31mRED?[0m?fake line?.py:3");
  FrameInfo native;
  native.function = "f";
  native.module = "/lib/lib\x7f.so";
  EXPECT_EQ(describe_frame(native), "f (lib?.so)");
  EXPECT_EQ(printable("host\r\n\t"), "host???");
  EXPECT_EQ(printable("naïve ✓"), "naïve ✓");  // UTF-8 is text
}

TEST(Printable, AnExcerptIsBoundedAndCutBetweenCharacters) {
  EXPECT_EQ(excerpt("short\n"), "short?");
  EXPECT_EQ(excerpt(std::string(81, 'x')), std::string(80, 'x') + "...");
  // "é" is two bytes: a cut after its first byte moves before it.
  EXPECT_EQ(excerpt("abcé", 4), "abc...");
  EXPECT_EQ(excerpt("abcé", 5), "abcé");
}

TEST(Printable, AReportsSchemaIsQuotedInOneBoundedLine) {
  // The fuzzer's find (2026-11-29): a 1,000-byte schema was quoted whole, and a "\n" in it broke
  // the error over two lines.
  for (const std::string& schema : {std::string(5000, 'y'), std::string("other\\nline"), "gpushim-report/2" + std::string(5000, '9')}) {
    ReportFile got;
    std::string err;
    EXPECT_FALSE(parse_report("{\"schema\":\"" + schema + "\"}", &got, &err));
    EXPECT_LT(err.size(), 200u) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace gpushim::analysis
