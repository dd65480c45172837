// What makes two stacks one site (stacks/site_identity.h).
#include "stacks/site_identity.h"

#include <gtest/gtest.h>

namespace gpushim {
namespace {

FrameInfo identity_frame(const char* module, const char* function, const char* file, int line) {
  FrameInfo f;
  f.module = module;
  f.function = function;
  f.file = file;
  f.line = line;
  return f;
}

TEST(SiteIdentity, TheCRuntimesLinesAreNotPartOfASite) {
  // The same stack from a machine with libc6-dbg (or an older shim, which gave libc frames lines)
  // and from one without: one site, so that `gpushim-analyze diff` pairs them.
  const std::vector<FrameInfo> with_lines = {
      identity_frame("/opt/app/train", "step()", "/src/train.cpp", 12),
      identity_frame("/lib/x86_64-linux-gnu/libc.so.6", "__libc_start_call_main",
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
