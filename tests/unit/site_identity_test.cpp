// What makes two stacks one site (stacks/site_identity.h).
#include "stacks/site_identity.h"

#include <gtest/gtest.h>

#include "test_frames.h"

namespace gpushim {
namespace {

TEST(SiteIdentity, TheCRuntimesLinesAreNotPartOfASite) {
  // The same stack from a machine with libc6-dbg (or an older shim, which gave libc frames lines)
  // and from one without: one site, so that `gpushim-analyze diff` pairs them.
  const std::vector<FrameInfo> with_lines = {
      native_frame("step()", "/opt/app/train", "/src/train.cpp", 12),
      native_frame("__libc_start_call_main", "/lib/x86_64-linux-gnu/libc.so.6",
                   "../sysdeps/nptl/libc_start_call_main.h", 58)};
  std::vector<FrameInfo> without = with_lines;
  without[1].file = "";
  without[1].line = 0;
  EXPECT_EQ(site_identity(0, "device", with_lines), site_identity(0, "device", without));
  // The program's own lines still tell sites apart.
  std::vector<FrameInfo> other_line = with_lines;
  other_line[0].line = 13;
  EXPECT_NE(site_identity(0, "device", with_lines), site_identity(0, "device", other_line));
}

}  // namespace
}  // namespace gpushim
