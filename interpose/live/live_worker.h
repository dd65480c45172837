// The shim's one background thread, "gpushim-live": it refreshes the metrics file at the sampling
// interval, so an idle process (stuck in a kernel, waiting on NCCL, sleeping) still shows current
// figures, and it writes the snapshots a signal asked for, so the signal handler does nothing but
// post a semaphore. Started at the first CUDA call, only when one of the two is on.
//
// Exit: stop() joins the thread before the exit report, so nothing it writes can race the last
// update or the CUDA runtime's teardown. fork: the child has no such thread; abandon_in_fork_child()
// forgets it without joining.
#pragma once

#include <pthread.h>
#include <semaphore.h>

#include <atomic>
#include <cstdint>
#include <functional>

namespace gpushim {

class LiveWorker {
 public:
  using Task = std::function<void()>;

  LiveWorker();
  LiveWorker(const LiveWorker&) = delete;
  LiveWorker& operator=(const LiveWorker&) = delete;

  // Starts the thread with every signal blocked (process signals keep going to the program's
  // threads). `periodic` runs at once and then every `interval_ns` (not at all when empty);
  // `on_wake` runs after each wake(). Returns 0 or the error of pthread_create.
  int start(uint64_t interval_ns, Task periodic, Task on_wake);

  // Async-signal-safe: the semaphore a signal handler posts.
  sem_t* wake_semaphore() { return &wake_; }
  void wake() { sem_post(&wake_); }

  // Stops and joins the thread, waiting for a task in progress to finish, at most `patience_ns`
  // (0: for as long as it takes). False when it gave up: the task is still running, and a later
  // call waits for it again (see LiveOutputs::stop). True when never started.
  bool stop(uint64_t patience_ns = 0);

  // In a fork child: the thread was not copied. Forget it, and make wake() harmless.
  void abandon_in_fork_child();

  bool running() const { return started_.load(std::memory_order_acquire); }

 private:
  static void* thread_main(void* self);
  void loop();

  sem_t wake_;
  pthread_t thread_{};
  std::atomic<bool> started_{false};
  std::atomic<bool> stopping_{false};
  bool joined_ = true;  // no thread left to join (only the stopping thread reads and writes it)
  uint64_t interval_ns_ = 0;
  Task periodic_;
  Task on_wake_;
};

}  // namespace gpushim
