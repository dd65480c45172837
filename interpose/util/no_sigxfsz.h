// Writing past RLIMIT_FSIZE raises SIGXFSZ, whose default action ends the whole process. A report
// or trace that outgrows a host's file-size limit must cost the file, never the host: while a
// ScopedNoSigxfsz lives, the calling thread's writes fail with EFBIG instead, and a SIGXFSZ they
// raised is discarded. One that was already pending before (the host's own) is left alone.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace gpushim {

class ScopedNoSigxfsz {
 public:
  ScopedNoSigxfsz() {
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &only, &saved_);
    sigset_t pending;
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1;
  }
  ~ScopedNoSigxfsz() {
    sigset_t pending;
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1) {
      sigset_t only;
      sigemptyset(&only);
      sigaddset(&only, SIGXFSZ);
      const timespec now = {0, 0};
      sigtimedwait(&only, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  ScopedNoSigxfsz(const ScopedNoSigxfsz&) = delete;
  ScopedNoSigxfsz& operator=(const ScopedNoSigxfsz&) = delete;

 private:
  sigset_t saved_;
  bool was_pending_ = false;
};

}  // namespace gpushim
