#include "live/replace_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>

#include "util/write_fully.h"

namespace gpushim {
namespace {

// Attempts at a fresh temporary name before giving up: a taken one is someone else's file (or a
// leftover), which is never removed, only avoided.
constexpr int kNameAttempts = 4;

// 16 hex digits no other process picks: processes in containers that share the directory may
// have equal pids.
std::string unique_tag() {
  uint64_t r = 0;
  ssize_t n;
  do {
    n = getrandom(&r, sizeof(r), GRND_NONBLOCK);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(r))) {
    // No entropy yet (early boot) or no getrandom: the clock, a counter and where this process's
    // stack lies still set apart the processes that share a pid.
    static std::atomic<uint64_t> counter{0};
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    r = static_cast<uint64_t>(ts.tv_sec) * 1000000007u ^ static_cast<uint64_t>(ts.tv_nsec) << 17 ^
        counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ull ^ reinterpret_cast<uintptr_t>(&ts);
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, r);
  return buf;
}

}  // namespace

std::string replacement_temp_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + name + ".tmp." + std::to_string(getpid()) + "." + unique_tag();
}

int replace_file_atomically(const std::string& path, const std::string& data, struct stat* written) {
  if (path.empty() || path.back() == '/') return EISDIR;
  // O_EXCL|O_NOFOLLOW: a name that is taken (by anything, a symlink included) is never written
  // through nor removed; another name is tried.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < kNameAttempts && fd < 0; ++attempt) {
    tmp = replacement_temp_path(path);
    do {
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno != EEXIST) return errno;
  }
  if (fd < 0) return EEXIST;
  int err;
  {
    // The last update is written from the host's exiting thread: write_fully makes a file-size
    // limit cost the update only.
    err = write_fully(fd, data.data(), data.size());
    if (err == 0 && written != nullptr && ::fstat(fd, written) != 0) err = errno;
    // close() is where NFS reports deferred write errors.
    if (::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  }
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) ::unlink(tmp.c_str());  // the file this call created, under its unique name
  return err;
}

}  // namespace gpushim
