// Names gpushim-analyze prints come from a program's symbols and paths, or a damaged input: each
// text line stays one line and sends the terminal nothing but text.
#include <gtest/gtest.h>

#include <string>

#include "offline_symbolizer.h"
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

}  // namespace
}  // namespace gpushim::analysis
