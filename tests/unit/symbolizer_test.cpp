#include "stacks/symbolizer.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "stacks/native_stack.h"
#include "stacks/stack_table.h"

namespace gpushim {
// Test hook defined in symbolizer.cpp (not part of the public header).
extern std::atomic<bool> g_symbolizer_libdw_disabled_for_testing;
}  // namespace gpushim

// External linkage and -rdynamic: in the dynamic symbol table, so dladdr can name them.
namespace gpushim_symtest {

__attribute__((noinline, noclone)) int exported_fn(int x, const char* s) {
  asm volatile("" ::: "memory");
  return x + (s != nullptr ? s[0] : 0);
}

// The call and __LINE__ sit on one line, so the return address's line is known.
constexpr int kCaptureLine = __LINE__ + 3;
__attribute__((noinline, noclone)) size_t capture_line(uint64_t* out, size_t max) {
  asm volatile("" ::: "memory");
  const size_t n = gpushim::capture_native_stack(out, max, 0);
  asm volatile("" ::: "memory");
  return n;
}

// Internal linkage: only .symtab (read through libdw) knows these names.
static __attribute__((noinline, noclone)) int static_helper(int x) {
  asm volatile("" ::: "memory");
  return x * 3;
}
constexpr int kStaticHelperLine = __LINE__ - 4;

// qsort calls back into us from inside libc, which puts a libc return address on the stack.
std::vector<uint64_t>* g_libc_stack = nullptr;
int compare_and_capture(const void* a, const void* b) {
  if (g_libc_stack != nullptr && g_libc_stack->empty()) {
    g_libc_stack->resize(64);
    g_libc_stack->resize(gpushim::capture_native_stack(g_libc_stack->data(), 64, 0));
  }
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}

}  // namespace gpushim_symtest

namespace gpushim {
namespace {

uint64_t addr_of(const void* fn) { return reinterpret_cast<uintptr_t>(fn); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool libdw_available() {
  static const bool available = dlopen("libdw.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
  return available;
}

// Restores libdw use however a test ends.
struct LibdwOff {
  LibdwOff() { g_symbolizer_libdw_disabled_for_testing.store(true); }
  ~LibdwOff() { g_symbolizer_libdw_disabled_for_testing.store(false); }
};

// The entry address plus one: resolve() looks up address-1, as it must for return addresses.
uint64_t entry_word(const void* fn) { return addr_of(fn) + 1; }

TEST(Symbolizer, ExportedFunctionDemangledInTestExecutable) {
  Symbolizer sym;
  const void* fn = reinterpret_cast<const void*>(&gpushim_symtest::exported_fn);
  const FrameInfo& f = sym.resolve(entry_word(fn));
  EXPECT_EQ(f.function, "gpushim_symtest::exported_fn(int, char const*)");
  EXPECT_FALSE(f.python);
  EXPECT_EQ(f.address, entry_word(fn));
  EXPECT_EQ(f.module, self_exe());
  Dl_info info{};
  ASSERT_NE(dladdr(fn, &info), 0);
  EXPECT_EQ(f.module_offset, entry_word(fn) - addr_of(info.dli_fbase));
  // module_of is dladdr's name (argv[0] for the main program): same file name.
  const std::string& mod = sym.module_of(addr_of(fn));
  const std::string exe = self_exe();
  EXPECT_TRUE(ends_with(mod, exe.substr(exe.find_last_of('/') + 1))) << mod << " vs " << exe;
}

TEST(Symbolizer, ReturnAddressGivesCallLine) {
  uint64_t out[16];
  const size_t n = gpushim_symtest::capture_line(out, 16);
  ASSERT_GE(n, 1u);
  Symbolizer sym;
  const FrameInfo& f = sym.resolve(out[0]);
  EXPECT_NE(f.function.find("gpushim_symtest::capture_line"), std::string::npos) << f.function;
  // scripts/setup installs libdw1: without it the report has no file:line, which is a failure.
  ASSERT_TRUE(libdw_available()) << "libdw.so.1 not loadable: no line info";
  EXPECT_TRUE(ends_with(f.file, "symbolizer_test.cpp")) << f.file;
  EXPECT_GE(f.line, gpushim_symtest::kCaptureLine - 1);
  EXPECT_LE(f.line, gpushim_symtest::kCaptureLine + 1);
}

TEST(Symbolizer, StaticFunctionThroughLibdw) {
  ASSERT_TRUE(libdw_available()) << "libdw.so.1 not loadable";
  const void* fn = reinterpret_cast<const void*>(&gpushim_symtest::static_helper);
  EXPECT_EQ(gpushim_symtest::static_helper(1), 3);  // keep it referenced and emitted
  Symbolizer sym;
  const FrameInfo& f = sym.resolve(entry_word(fn));
  EXPECT_EQ(f.function, "gpushim_symtest::static_helper(int)");
  EXPECT_TRUE(ends_with(f.file, "symbolizer_test.cpp")) << f.file;
  // The entry maps to the function's first line (its declaration) or one of the next few.
  EXPECT_GE(f.line, gpushim_symtest::kStaticHelperLine);
  EXPECT_LE(f.line, gpushim_symtest::kStaticHelperLine + 3);
  EXPECT_EQ(f.module, self_exe());
}

TEST(Symbolizer, WithoutLibdwDladdrOnly) {
  LibdwOff off;
  Symbolizer sym;
  const void* fn = reinterpret_cast<const void*>(&gpushim_symtest::exported_fn);
  const FrameInfo& f = sym.resolve(entry_word(fn));
  EXPECT_EQ(f.function, "gpushim_symtest::exported_fn(int, char const*)");
  EXPECT_EQ(f.file, "");
  EXPECT_EQ(f.line, 0);
  EXPECT_EQ(f.module, self_exe());
  EXPECT_NE(f.module_offset, 0u);
  // A static function is invisible to dladdr: no name rather than a wrong one.
  const FrameInfo& s = sym.resolve(entry_word(reinterpret_cast<const void*>(&gpushim_symtest::static_helper)));
  EXPECT_EQ(s.function.find("exported_fn"), std::string::npos) << s.function;
  EXPECT_EQ(s.module, self_exe());
}

TEST(Symbolizer, LibcFunctionResolvesToLibc) {
  Symbolizer sym;
  // libc's own qsort: under ASan, RTLD_DEFAULT would find the sanitizer's interceptor first.
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  void* q = dlsym(libc, "qsort");
  dlclose(libc);
  ASSERT_NE(q, nullptr);
  const FrameInfo& f = sym.resolve(addr_of(q) + 1);
  EXPECT_NE(f.module.find("libc.so"), std::string::npos) << f.module;
  EXPECT_NE(f.function.find("qsort"), std::string::npos) << f.function;
  EXPECT_NE(sym.module_of(addr_of(q)).find("libc.so"), std::string::npos);
  // Named, never given a line: with libc6-dbg installed (as here and on CI) a line meant inflating
  // glibc's compressed DWARF at every reporting process's exit (c_runtime_module).
  EXPECT_EQ(f.file, "") << f.file << ":" << f.line;
  EXPECT_EQ(f.line, 0);

  // A real return address inside libc, taken from a qsort callback.
  std::vector<uint64_t> stack;
  gpushim_symtest::g_libc_stack = &stack;
  int v[] = {3, 1, 2, 5, 4};
  qsort(v, 5, sizeof(int), gpushim_symtest::compare_and_capture);
  gpushim_symtest::g_libc_stack = nullptr;
  ASSERT_GE(stack.size(), 2u);
  bool saw_libc = false;
  for (uint64_t w : stack) saw_libc |= sym.resolve(w).module.find("libc.so") != std::string::npos;
  EXPECT_TRUE(saw_libc);
}

bool fake_python_resolver(uint32_t id, FrameInfo* out) {
  if (id != 42) return false;
  out->function = "train_step";
  out->file = "train.py";
  out->line = 7;
  return true;
}

TEST(Symbolizer, PythonFrames) {
  Symbolizer sym;
  const FrameInfo& unresolved = sym.resolve(make_python_frame(5));
  EXPECT_TRUE(unresolved.python);
  EXPECT_EQ(unresolved.function, "<python frame 5>");
  EXPECT_EQ(unresolved.address, 0u);

  Symbolizer with;
  with.set_python_resolver(fake_python_resolver);
  const FrameInfo& f = with.resolve(make_python_frame(42));
  EXPECT_TRUE(f.python);
  EXPECT_EQ(f.function, "train_step");
  EXPECT_EQ(f.file, "train.py");
  EXPECT_EQ(f.line, 7);
  EXPECT_EQ(f.address, 0u);
  EXPECT_EQ(with.resolve(make_python_frame(43)).function, "<python frame 43>");
}

TEST(Symbolizer, CachesAndSurvivesBadAddresses) {
  Symbolizer sym;
  const void* fn = reinterpret_cast<const void*>(&gpushim_symtest::exported_fn);
  const FrameInfo& a = sym.resolve(entry_word(fn));
  const FrameInfo& b = sym.resolve(entry_word(fn));
  EXPECT_EQ(&a, &b);
  for (uint64_t bad : {0ull, 1ull, 0x10ull, 0xFFFFFFFFFFFFull}) {
    const FrameInfo& f = sym.resolve(bad);
    EXPECT_EQ(f.function, "") << bad;
    EXPECT_EQ(f.module, "") << bad;
    EXPECT_EQ(f.address, bad);
    EXPECT_EQ(sym.module_of(bad), "");
  }
}

}  // namespace
}  // namespace gpushim
