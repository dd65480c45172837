// Allocates in known phases and pauses between them, so that a test can look at the process while
// it runs: signal it for a snapshot, read its metrics file, compare both with what it holds.
//
// Each phase prints one JSON line (what the program holds, the shim's own figures, how the snapshot
// signals are handled) and then waits for a line on stdin. At the end it frees phase one's blocks
// and exits with phase two's still live.
//
// Usage: e2e_live_phases [--own-usr2] [--fork]
//   --own-usr2  installs the program's own SIGUSR2 handler before its first CUDA call
//   --fork      after phase one, forks a child that checks its SIGUSR2 disposition and leaves
//               through exit(); the exit status says what it saw (0: the default disposition)
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;
std::atomic<int> g_own_handler_calls{0};
std::vector<void*> g_phase_one, g_phase_two;
void* g_five_mib = nullptr;
size_t g_requested = 0;
size_t g_count = 0;

// Says so on stderr too (write() is async-signal-safe), so that a test can wait for it.
void own_usr2_handler(int) {
  g_own_handler_calls.fetch_add(1);
  static const char kLine[] = "own SIGUSR2 handler ran\n";
  const ssize_t n = write(2, kLine, sizeof kLine - 1);
  (void)n;
}

const char* disposition(int signo) {
  struct sigaction sa {};
  sigaction(signo, nullptr, &sa);
  if (!(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL) return "default";
  if (!(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_IGN) return "ignore";
  if (!(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == own_usr2_handler) return "program";
  return "shim";
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  g_requested += bytes;
  ++g_count;
  return p;
}

void release(void* p, size_t bytes) {
  CHECK(cudaFree(p));
  g_requested -= bytes;
  --g_count;
}

__attribute__((noinline)) void phase_one() {
  for (int i = 0; i < 3; ++i) g_phase_one.push_back(alloc(1 * kMiB));
  g_five_mib = alloc(5 * kMiB);
}

__attribute__((noinline)) void phase_two() {
  for (int i = 0; i < 2; ++i) g_phase_two.push_back(alloc(8 * kMiB));
  release(g_five_mib, 5 * kMiB);
}

__attribute__((noinline)) void finish() {
  for (void* p : g_phase_one) release(p, 1 * kMiB);
}

// Waits for the test's next line on stdin. poll() before read(): ThreadSanitizer runs a handler
// for a signal that arrives while the thread blocks in poll() at once, but holds it back until
// read() returns, which would delay the snapshot the test asks for until its next line. A signal
// can interrupt either call (the program's own handler, --own-usr2, has no SA_RESTART): wait on.
void wait_for_line() {
  static std::string pending;
  for (;;) {
    const size_t newline = pending.find('\n');
    if (newline != std::string::npos) {
      pending.erase(0, newline + 1);
      return;
    }
    pollfd in{STDIN_FILENO, POLLIN, 0};
    if (poll(&in, 1, -1) < 0) {
      if (errno == EINTR) continue;
      std::exit(2);
    }
    char buf[64];
    const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::exit(2);  // the test went away
    pending.append(buf, static_cast<size_t>(n));
  }
}

void report_and_wait(int phase, int child_status) {
  gpushim_device_stats s{};
  const bool shim = testsupport::shim_stats(0, &s);
  std::printf("{\"phase\":%d,\"pid\":%d,\"requested_bytes\":%zu,\"live_count\":%zu,\"usr1\":\"%s\",\"usr2\":\"%s\","
              "\"own_handler_calls\":%d,\"child_status\":%d,\"shim\":",
              phase, static_cast<int>(getpid()), g_requested, g_count, disposition(SIGUSR1), disposition(SIGUSR2),
              g_own_handler_calls.load(), child_status);
  if (shim)
    std::printf("{\"live_bytes\":%llu,\"live_count\":%llu,\"requested_bytes\":%llu,\"reserved_bytes\":%llu,"
                "\"peak_allocated_bytes\":%llu,\"peak_reserved_bytes\":%llu,\"total_allocs\":%llu,"
                "\"total_frees\":%llu,\"ooms\":%llu}}\n",
                s.live_bytes, s.live_count, s.requested_bytes, s.reserved_bytes, s.peak_allocated_bytes,
                s.peak_reserved_bytes, s.total_allocs, s.total_frees, s.ooms);
  else
    std::printf("null}\n");
  std::fflush(stdout);
  wait_for_line();
}

int fork_child_and_wait() {
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    // The shim's handler must not linger in a child: it writes nothing, so the signal should do
    // what it did before the shim. exit() (not _exit) runs the shim's exit path in the child too.
    std::exit(std::strcmp(disposition(SIGUSR2), "default") == 0 ? 0 : 10);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

int main(int argc, char** argv) {
  bool own_usr2 = false, do_fork = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--own-usr2") == 0) own_usr2 = true;
    else if (std::strcmp(argv[i], "--fork") == 0) do_fork = true;
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (own_usr2) {
    struct sigaction sa {};
    sa.sa_handler = own_usr2_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, nullptr);
  }
  phase_one();
  const int child_status = do_fork ? fork_child_and_wait() : -1;
  report_and_wait(1, child_status);
  phase_two();
  report_and_wait(2, -1);
  finish();
  return 0;
}
