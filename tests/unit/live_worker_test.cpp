#include "live/live_worker.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace gpushim {
namespace {

bool WaitFor(const std::function<bool()>& cond) {
  for (int i = 0; i < 2000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

TEST(LiveWorker, PeriodicRunsAtOnceThenEveryIntervalUntilStopped) {
  LiveWorker w;
  std::atomic<int> ticks{0};
  ASSERT_EQ(w.start(2'000'000, [&] { ++ticks; }, [] {}), 0);
  EXPECT_TRUE(w.running());
  EXPECT_TRUE(WaitFor([&] { return ticks.load() >= 5; }));
  w.stop();
  EXPECT_FALSE(w.running());
  const int after_stop = ticks.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ticks.load(), after_stop);
  w.stop();  // idempotent
}

TEST(LiveWorker, WakeRunsTheWakeTaskWithoutPeriodicWork) {
  LiveWorker w;
  std::atomic<int> wakes{0};
  ASSERT_EQ(w.start(1'000'000, nullptr, [&] { ++wakes; }), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(wakes.load(), 0);  // no interval work and no spurious wake
  w.wake();
  EXPECT_TRUE(WaitFor([&] { return wakes.load() == 1; }));
  sem_post(w.wake_semaphore());
  EXPECT_TRUE(WaitFor([&] { return wakes.load() == 2; }));
  w.stop();
}

TEST(LiveWorker, StopWaitsForATaskInProgress) {
  LiveWorker w;
  std::atomic<bool> in_task{false}, finished{false};
  ASSERT_EQ(w.start(0, nullptr,
                    [&] {
                      in_task = true;
                      std::this_thread::sleep_for(std::chrono::milliseconds(50));
                      finished = true;
                    }),
            0);
  w.wake();
  ASSERT_TRUE(WaitFor([&] { return in_task.load(); }));
  w.stop();
  EXPECT_TRUE(finished.load());
}

TEST(LiveWorker, TheThreadBlocksEverySignalAndIsNamed) {
  LiveWorker w;
  std::atomic<int> blocked_usr2{-1}, blocked_int{-1};
  char name[32] = {0};
  std::atomic<bool> named{false};
  ASSERT_EQ(w.start(1'000'000,
                    [&] {
                      sigset_t cur;
                      pthread_sigmask(SIG_SETMASK, nullptr, &cur);
                      blocked_usr2 = sigismember(&cur, SIGUSR2);
                      blocked_int = sigismember(&cur, SIGINT);
                      named = pthread_getname_np(pthread_self(), name, sizeof(name)) == 0;
                    },
                    nullptr),
            0);
  ASSERT_TRUE(WaitFor([&] { return blocked_usr2.load() != -1 && named.load(); }));
  w.stop();
  EXPECT_EQ(blocked_usr2.load(), 1);
  EXPECT_EQ(blocked_int.load(), 1);
  EXPECT_STREQ(name, "gpushim-live");
  // The creating thread's own mask is as it was.
  sigset_t mine;
  pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  EXPECT_EQ(sigismember(&mine, SIGUSR2), 0);
}

TEST(LiveWorker, StopWithoutStartIsANoOp) {
  LiveWorker w;
  w.stop();
  EXPECT_FALSE(w.running());
}

}  // namespace
}  // namespace gpushim
