#include "live/snapshot_signal.h"

#include <errno.h>
#include <signal.h>

#include <atomic>
#include <cstring>

#include "util/log.h"

namespace gpushim {
namespace {

std::atomic<sem_t*> g_wake{nullptr};
std::atomic<uint64_t> g_requests{0};
int g_signo = 0;                 // the signal we installed on; 0 = none
struct sigaction g_previous {};  // its disposition before us

void on_snapshot_signal(int) {
  const int saved = errno;
  g_requests.fetch_add(1, std::memory_order_relaxed);
  if (sem_t* s = g_wake.load(std::memory_order_acquire)) sem_post(s);
  errno = saved;
}

// A handler of the program's own, or SIG_IGN: either way the program decided what the signal does.
bool program_claims(const struct sigaction& sa) {
  return (sa.sa_flags & SA_SIGINFO) != 0 || sa.sa_handler != SIG_DFL;
}

const char* signal_name(int signo) {
  if (signo == SIGUSR1) return "SIGUSR1";
  if (signo == SIGUSR2) return "SIGUSR2";
  return "the snapshot signal";
}

void refuse(int signo, const struct sigaction& theirs) {
  log_line("%s %s in this program; snapshots on %s are off (GPUSHIM_SNAPSHOT_SIGNAL=%s picks the other signal)",
           signal_name(signo),
           (theirs.sa_flags & SA_SIGINFO) == 0 && theirs.sa_handler == SIG_IGN ? "is ignored" : "already has a handler",
           signal_name(signo), signo == SIGUSR1 ? "USR2" : "USR1");
}

}  // namespace

bool install_snapshot_signal(int signo, sem_t* wake) {
  struct sigaction current {};
  if (sigaction(signo, nullptr, &current) != 0) {
    log_line("cannot query %s (%s); snapshots are off", signal_name(signo), std::strerror(errno));
    return false;
  }
  if (program_claims(current)) {
    refuse(signo, current);
    return false;
  }
  g_wake.store(wake, std::memory_order_release);
  struct sigaction ours {};
  ours.sa_handler = on_snapshot_signal;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;  // the program's interrupted system calls resume as if nothing happened
  struct sigaction previous {};
  if (sigaction(signo, &ours, &previous) != 0) {
    log_line("cannot install the %s handler (%s); snapshots are off", signal_name(signo), std::strerror(errno));
    return false;
  }
  if (program_claims(previous)) {
    // Another thread installed one between the query and ours: theirs wins.
    sigaction(signo, &previous, nullptr);
    refuse(signo, previous);
    return false;
  }
  g_previous = previous;
  g_signo = signo;
  return true;
}

uint64_t take_snapshot_requests() { return g_requests.exchange(0, std::memory_order_relaxed); }

void restore_snapshot_signal() {
  if (g_signo == 0) return;
  g_wake.store(nullptr, std::memory_order_release);
  struct sigaction current {};
  if (sigaction(g_signo, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
      current.sa_handler == on_snapshot_signal)
    sigaction(g_signo, &g_previous, nullptr);
  g_signo = 0;
  g_requests.store(0, std::memory_order_relaxed);
}

}  // namespace gpushim
