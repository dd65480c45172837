#include "live/live_worker.h"

#include <errno.h>
#include <algorithm>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/own_threads.h"

namespace gpushim {

namespace {
constexpr char kThreadName[] = "gpushim-live";  // at most 15 characters: the kernel's limit
constexpr uint64_t kOrphanCheckNs = 1000000000ull;
}  // namespace

LiveWorker::LiveWorker() { sem_init(&wake_, 0, 0); }

int LiveWorker::start(uint64_t interval_ns, Task periodic, Task on_wake) {
  if (started_.load(std::memory_order_acquire)) return 0;
  interval_ns_ = periodic ? interval_ns : 0;
  periodic_ = std::move(periodic);
  on_wake_ = std::move(on_wake);
  stopping_.store(false, std::memory_order_relaxed);
  // The new thread inherits the creating thread's mask: block everything around the creation so
  // that no signal meant for the program is ever delivered to our thread.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  const int err = pthread_create(&thread_, nullptr, &LiveWorker::thread_main, this);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (err != 0) return err;
  // Named here too, not only by the thread itself: whoever looks right after the first CUDA call
  // (top -H, gdb, /proc/<pid>/task/*/comm) must find it by name, and it may not have run yet.
  pthread_setname_np(thread_, kThreadName);
  joined_ = false;
  started_.store(true, std::memory_order_release);
  return 0;
}

void* LiveWorker::thread_main(void* self) {
  // And here, before its first task: the creator's naming may come after that task has run.
  pthread_setname_np(pthread_self(), kThreadName);
  note_own_thread();
  static_cast<LiveWorker*>(self)->loop();
  return nullptr;
}

void LiveWorker::loop() {
  uint64_t next_ns = now_ns();
  for (;;) {
    if (interval_ns_ != 0) {
      const uint64_t now = now_ns();
      if (now >= next_ns) {
        periodic_();
        // Ticks missed while a task ran are skipped, not run back to back.
        next_ns += interval_ns_;
        if (next_ns <= now_ns()) next_ns = now_ns() + interval_ns_;
      }
    }
    // Never longer than a second: a program whose threads all ended must not live on for this one.
    const uint64_t wake_ns = interval_ns_ != 0 ? std::min(next_ns, now_ns() + kOrphanCheckNs) : now_ns() + kOrphanCheckNs;
    const timespec deadline{static_cast<time_t>(wake_ns / 1000000000ull), static_cast<long>(wake_ns % 1000000000ull)};
    const int r = sem_clockwait(&wake_, CLOCK_MONOTONIC, &deadline);  // now_ns() is CLOCK_MONOTONIC
    if (r != 0) {  // ETIMEDOUT: a tick is due, or a check; EINTR cannot happen with every signal blocked
      end_process_if_orphaned();
      continue;
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    if (on_wake_) on_wake_();
  }
}

bool LiveWorker::stop(uint64_t patience_ns) {
  if (started_.exchange(false, std::memory_order_acq_rel)) {
    stopping_.store(true, std::memory_order_release);
    sem_post(&wake_);
  }
  if (joined_) return true;
  // The worker itself ends the process when the program's threads are gone (own_threads.h), and
  // the exit path then stops it from its own thread: it returns from the exit, never to the loop.
  if (pthread_equal(thread_, pthread_self())) return joined_ = true;
  if (patience_ns == 0) return joined_ = pthread_join(thread_, nullptr) == 0;
  // Polled with pthread_tryjoin_np on the monotonic clock: pthread_clockjoin_np is unknown to
  // clang-14's TSan (which then reports the thread leaked), and pthread_timedjoin_np's deadline is
  // on the wall clock, which a clock step moves. At exit only, and only while a task runs.
  const uint64_t deadline = now_ns() + patience_ns;
  for (;;) {
    if (pthread_tryjoin_np(thread_, nullptr) == 0) return joined_ = true;
    if (now_ns() >= deadline) return false;
    usleep(5 * 1000);
  }
}

void LiveWorker::abandon_in_fork_child() {
  started_.store(false, std::memory_order_release);
  joined_ = true;  // the thread was not copied
  // The parent's thread may have been inside sem_* at fork time: start from a fresh semaphore.
  sem_init(&wake_, 0, 0);
}

}  // namespace gpushim
