#include "live/termination_signals.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstring>

#include "util/log.h"
#include "util/own_threads.h"

namespace gpushim {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr char kThreadName[] = "gpushim-exit";

sem_t g_wake;
std::atomic<int> g_pending{0};      // the first termination signal delivered; 0 = none
std::atomic<bool> g_ours[2] = {};   // per kSignals entry: our handler was installed
void (*g_write_report)() = nullptr;

void default_disposition(int signo) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signo, &dfl, nullptr);
}

void on_termination_signal(int signo) {
  const int saved = errno;
  int none = 0;
  if (g_pending.compare_exchange_strong(none, signo)) {
    sem_post(&g_wake);
  } else {
    // Asked again while the report is written: the default action now. The signal is blocked
    // during its own handler, so raise() delivers it as soon as this returns.
    default_disposition(signo);
    raise(signo);
  }
  errno = saved;
}

void* reporter_main(void*) {
  pthread_setname_np(pthread_self(), kThreadName);
  note_own_thread();
  for (;;) {
    timespec deadline{};
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += 1;
    if (sem_clockwait(&g_wake, CLOCK_MONOTONIC, &deadline) == 0) break;
    end_process_if_orphaned();  // a program whose threads all ended must not live on for this one
  }
  const int signo = g_pending.load();
  g_write_report();
  // The original disposition, then the signal again, delivered to this very thread (unblocked for
  // it alone): the process ends by the signal, with the status its parent expects.
  default_disposition(signo);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, signo);
  raise(signo);
  pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
  return nullptr;
}

bool is_default(int signo) {
  struct sigaction current {};
  return sigaction(signo, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
         current.sa_handler == SIG_DFL;
}

}  // namespace

bool install_termination_report(void (*write_report)()) {
  bool any = false;
  for (int signo : kSignals) any |= is_default(signo);
  if (!any) return false;
  g_write_report = write_report;
  sem_init(&g_wake, 0, 0);
  // Started with every signal blocked (the new thread inherits the mask): no signal meant for the
  // program is ever delivered to it.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_t thread;
  const int err = pthread_create(&thread, nullptr, &reporter_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (err != 0) {
    log_line("cannot start the %s thread (%s); SIGTERM and SIGINT will end the process without a report",
             kThreadName, std::strerror(err));
    return false;
  }
  pthread_detach(thread);
  bool installed = false;
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    const int signo = kSignals[i];
    if (!is_default(signo)) continue;
    struct sigaction ours {};
    ours.sa_handler = on_termination_signal;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_RESTART;  // interrupted system calls resume while the report is written
    struct sigaction previous {};
    if (sigaction(signo, &ours, &previous) != 0) continue;
    if ((previous.sa_flags & SA_SIGINFO) != 0 || previous.sa_handler != SIG_DFL) {
      sigaction(signo, &previous, nullptr);  // the program claimed it meanwhile: theirs wins
      continue;
    }
    g_ours[i].store(true);
    installed = true;
  }
  return installed;
}

void restore_termination_signals() {
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    if (!g_ours[i].exchange(false)) continue;
    struct sigaction current {};
    if (sigaction(kSignals[i], nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
        current.sa_handler == on_termination_signal)
      default_disposition(kSignals[i]);
  }
}

}  // namespace gpushim
