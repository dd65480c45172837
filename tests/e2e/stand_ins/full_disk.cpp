// A full filesystem for machines where a test cannot mount a tiny tmpfs (no user namespaces, as
// in most containers). Preloaded ahead of the shim, it interposes write(): writes to files under
// FULLDISK_DIR succeed until FULLDISK_BYTES bytes have gone there in all, the one that crosses the
// line is cut short, and every later one fails with ENOSPC, as a real filesystem behaves.
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using WriteFn = ssize_t (*)(int, const void*, size_t);

bool under_full_dir(int fd, const char* dir) {
  char link[64];
  char path[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t len = readlink(link, path, sizeof path - 1);
  if (len <= 0) return false;
  path[len] = '\0';
  return std::strncmp(path, dir, std::strlen(dir)) == 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) ssize_t write(int fd, const void* buf, size_t n) {
  static const WriteFn real = reinterpret_cast<WriteFn>(dlsym(RTLD_NEXT, "write"));
  static const char* const dir = std::getenv("FULLDISK_DIR");
  static const long long capacity = std::getenv("FULLDISK_BYTES") ? std::atoll(std::getenv("FULLDISK_BYTES")) : 0;
  static std::atomic<long long> used{0};
  if (dir != nullptr && *dir != '\0' && fd > 2 && n > 0 && under_full_dir(fd, dir)) {
    const long long want = static_cast<long long>(n);
    const long long before = used.fetch_add(want);
    const long long room = capacity - before;
    if (room <= 0) {
      used.fetch_sub(want);
      errno = ENOSPC;
      return -1;
    }
    if (room < want) {
      used.fetch_sub(want - room);
      n = static_cast<size_t>(room);
    }
  }
  return real(fd, buf, n);
}
