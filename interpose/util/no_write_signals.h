// Two signals a write can raise end the whole process by default: SIGXFSZ, writing past
// RLIMIT_FSIZE, and SIGPIPE, writing to a pipe or socket whose reader is gone (`prog 2>&1 | head`,
// a log collector that died). A report, trace or line the shim cannot deliver must cost that
// output, never the host: while a ScopedNoWriteSignals lives, the calling thread's writes fail
// with EFBIG or EPIPE instead, and such a signal they raised is discarded. One that was already
// pending before (the host's own) is left alone.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace gpushim {

class ScopedNoWriteSignals {
 public:
  ScopedNoWriteSignals() {
    sigset_t ours = signals();
    pthread_sigmask(SIG_BLOCK, &ours, &saved_);
    sigset_t pending;
    if (sigpending(&pending) == 0) {
      xfsz_was_pending_ = sigismember(&pending, SIGXFSZ) == 1;
      pipe_was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    }
  }
  ~ScopedNoWriteSignals() {
    sigset_t pending;
    if (sigpending(&pending) == 0) {
      discard_raised(pending, SIGXFSZ, xfsz_was_pending_);
      discard_raised(pending, SIGPIPE, pipe_was_pending_);
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  ScopedNoWriteSignals(const ScopedNoWriteSignals&) = delete;
  ScopedNoWriteSignals& operator=(const ScopedNoWriteSignals&) = delete;

 private:
  static sigset_t signals() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGXFSZ);
    sigaddset(&s, SIGPIPE);
    return s;
  }
  static void discard_raised(const sigset_t& pending, int signo, bool was_pending) {
    if (was_pending || sigismember(&pending, signo) != 1) return;
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, signo);
    const timespec now = {0, 0};
    sigtimedwait(&only, nullptr, &now);
  }

  sigset_t saved_;
  bool xfsz_was_pending_ = false;
  bool pipe_was_pending_ = false;
};

}  // namespace gpushim
