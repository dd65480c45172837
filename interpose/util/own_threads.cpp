#include "util/own_threads.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "util/clock.h"

namespace gpushim {
namespace {

constexpr int kMaxOwn = 16;
std::atomic<pid_t> g_own[kMaxOwn];
std::atomic<uint64_t> g_last_check_ns{0};
std::atomic<bool> g_ending{false};
constexpr uint64_t kCheckEveryNs = 1000000000ull;

// Whether thread `tid` of this process still runs: its state in /proc/self/task/<tid>/stat is
// neither a zombie (an exited thread whose process lives on: the main thread after pthread_exit)
// nor dead. Unreadable counts as running: never end a process on a guess.
bool running(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  if (paren == nullptr || paren[1] != ' ') return true;
  const char state = paren[2];
  return state != 'Z' && state != 'X' && state != 'x';
}

bool is_own(pid_t tid) {
  for (const auto& slot : g_own)
    if (slot.load(std::memory_order_relaxed) == tid) return true;
  return false;
}

// Every thread of the process is ours or has ended.
bool only_own_threads_left() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return false;
  bool only_ours = true;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (!is_own(tid) && running(tid)) {
      only_ours = false;
      break;
    }
  }
  ::closedir(dir);
  return only_ours;
}

}  // namespace

void note_own_thread() {
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  for (auto& slot : g_own) {
    pid_t none = 0;
    if (slot.compare_exchange_strong(none, tid)) return;
  }
}

void end_process_if_orphaned() {
  const uint64_t now = now_ns();
  uint64_t last = g_last_check_ns.load(std::memory_order_relaxed);
  if (now - last < kCheckEveryNs || !g_last_check_ns.compare_exchange_strong(last, now)) return;
  if (running(::getpid())) return;  // the main thread lives: the usual case, one file read
  if (!only_own_threads_left()) return;
  // Asked again a moment later: one directory listing can miss a thread created while it was read
  // and see its creator already gone (a pool replacing a worker), and that program lives on.
  ::usleep(50 * 1000);
  if (!only_own_threads_left()) return;
  if (g_ending.exchange(true)) return;
  ::exit(0);  // what glibc does when the last thread of the program ends
}

}  // namespace gpushim
