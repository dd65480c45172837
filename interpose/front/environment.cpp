// One variable added to the environment at start-up without malloc (front.h).
//
// setenv's first call initializes malloc: in a process that never allocates (/bin/true) that was
// most of what choosing PyTorch's allocator cost every preloaded process (issue 30: 3% of
// /bin/true's start-up, measured with bench/startup_bench.cpp). POSIX lets a program point
// `environ` at an array of its own, and glibc's functions keep working on one: setenv copies it
// into an array of its own before growing it, unsetenv and a replacing setenv edit it in place
// (it is writable), clearenv only drops it.
//
// Only while no other thread exists: a program's dependencies are initialized before the preload,
// and a thread one of them started may be inside setenv, which takes glibc's lock and may free the
// array this would copy; the array installed here would then drop that thread's variable (or it
// ours), or hold pointers out of freed memory. With another thread, setenv and its lock.
#include <stdlib.h>
#include <string.h>
#include <sys/single_threaded.h>

#include "front/front.h"

extern char** environ;

namespace {

// Enough for the environments seen in practice (a larger one takes setenv's path), and small
// enough (2 KiB) to share the page of the front's other variables, which the loader has already
// touched: a page of its own would cost every preloaded process one more page fault.
constexpr size_t kMaxEntries = 256;
char* g_entries[kMaxEntries];
char g_variable[128];  // "NAME=value"

}  // namespace

namespace gpushim::front {

void add_to_environment(const char* name, const char* value) {
  // Not even the count without glibc's lock: another thread's setenv may free the array.
  if (!__libc_single_threaded) {
    setenv(name, value, /*overwrite=*/0);
    return;
  }
  size_t n = 0;
  if (environ != nullptr)
    while (environ[n] != nullptr) ++n;
  const size_t name_len = strlen(name), value_len = strlen(value);
  if (n + 2 > kMaxEntries || name_len + value_len + 2 > sizeof g_variable) {
    setenv(name, value, /*overwrite=*/0);
    return;
  }
  memcpy(g_variable, name, name_len);
  g_variable[name_len] = '=';
  memcpy(g_variable + name_len + 1, value, value_len + 1);
  if (n != 0) memcpy(g_entries, environ, n * sizeof(char*));
  g_entries[n] = g_variable;
  g_entries[n + 1] = nullptr;
  environ = g_entries;
}

}  // namespace gpushim::front
