// The one walk over the loaded objects (util/loaded_modules.h) that the module map, the trace's
// module records and the interpreter's range all read.
#include "util/loaded_modules.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace gpushim {
namespace {

__attribute__((noinline)) void a_function_of_this_test() { asm volatile(""); }

void* libc_function() { return dlsym(dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD), "getpid"); }

TEST(LoadedModules, TheMainProgramComesFirstUnderItsRealPath) {
  const std::string exe = self_exe_path();
  ASSERT_FALSE(exe.empty());
  EXPECT_EQ(exe[0], '/');
  int seen = 0;
  bool first_is_main = false;
  const auto self = reinterpret_cast<uintptr_t>(&a_function_of_this_test);
  for_each_loaded_module([&](const LoadedModule& m) {
    if (seen++ == 0) first_is_main = m.is_main && self >= m.begin && self < m.end;
    EXPECT_LT(m.begin, m.end);
    EXPECT_LE(m.bias, m.begin);
    return true;
  });
  EXPECT_GT(seen, 2);  // the program, libc, the loader at least
  EXPECT_TRUE(first_is_main);
}

TEST(LoadedModules, RangesHoldTheirAddressesAndTheWalkStopsWhenAsked) {
  uintptr_t b1 = 0, e1 = 0, b2 = 0, e2 = 0;
  const auto self = reinterpret_cast<uintptr_t>(&a_function_of_this_test);
  const auto libc = reinterpret_cast<uintptr_t>(libc_function());
  ASSERT_NE(libc, 0u);
  ASSERT_TRUE(loaded_module_range(self, &b1, &e1));
  ASSERT_TRUE(loaded_module_range(libc, &b2, &e2));
  EXPECT_TRUE(self >= b1 && self < e1);
  EXPECT_TRUE(libc >= b2 && libc < e2);
  EXPECT_TRUE(e1 <= b2 || e2 <= b1) << "two objects, two disjoint ranges";
  uintptr_t b = 0, e = 0;
  EXPECT_FALSE(loaded_module_range(0, &b, &e));
  int calls = 0;
  for_each_loaded_module([&](const LoadedModule&) { return ++calls < 2; });
  EXPECT_EQ(calls, 2);
}

TEST(LoadedModules, BuildIdIsTheNoteOfTheFile) {
  std::string libc_id;
  const auto libc = reinterpret_cast<uintptr_t>(libc_function());
  for_each_loaded_module([&](const LoadedModule& m) {
    if (libc < m.begin || libc >= m.end) return true;
    libc_id = loaded_module_build_id(m);
    return false;
  });
  // Debian's libc carries a 20-byte GNU build id (sha1).
  EXPECT_EQ(libc_id.size(), 20u);
  EXPECT_EQ(loaded_module_build_id(LoadedModule{}), "");
}

}  // namespace
}  // namespace gpushim
