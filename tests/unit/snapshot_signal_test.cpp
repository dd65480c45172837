#include "live/snapshot_signal.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "util/log.h"

namespace gpushim {
namespace {

std::atomic<int> g_program_handler_calls{0};
void ProgramHandler(int) { ++g_program_handler_calls; }

struct sigaction Current(int signo) {
  struct sigaction sa {};
  sigaction(signo, nullptr, &sa);
  return sa;
}

void SetDisposition(int signo, void (*h)(int)) {
  struct sigaction sa {};
  sa.sa_handler = h;
  sigemptyset(&sa.sa_mask);
  sigaction(signo, &sa, nullptr);
}

TEST(SnapshotSignal, HandlerCountsRequestsAndPostsTheSemaphore) {
  SetDisposition(SIGUSR1, SIG_DFL);
  sem_t wake;
  sem_init(&wake, 0, 0);
  take_snapshot_requests();
  ASSERT_TRUE(install_snapshot_signal(SIGUSR1, &wake));
  EXPECT_NE(Current(SIGUSR1).sa_handler, SIG_DFL);
  EXPECT_TRUE(Current(SIGUSR1).sa_flags & SA_RESTART);
  raise(SIGUSR1);
  raise(SIGUSR1);
  EXPECT_EQ(sem_trywait(&wake), 0);
  EXPECT_EQ(sem_trywait(&wake), 0);
  EXPECT_EQ(take_snapshot_requests(), 2u);
  EXPECT_EQ(take_snapshot_requests(), 0u);
  restore_snapshot_signal();
  EXPECT_EQ(Current(SIGUSR1).sa_handler, SIG_DFL);
}

TEST(SnapshotSignal, AProgramHandlerOrIgnoreIsNeverReplaced) {
  set_log_enabled(false);
  g_program_handler_calls = 0;
  sem_t wake;
  sem_init(&wake, 0, 0);
  SetDisposition(SIGUSR2, ProgramHandler);
  EXPECT_FALSE(install_snapshot_signal(SIGUSR2, &wake));
  EXPECT_EQ(Current(SIGUSR2).sa_handler, ProgramHandler);
  raise(SIGUSR2);
  EXPECT_EQ(g_program_handler_calls.load(), 1);
  EXPECT_EQ(sem_trywait(&wake), -1);

  SetDisposition(SIGUSR2, SIG_IGN);
  EXPECT_FALSE(install_snapshot_signal(SIGUSR2, &wake));
  EXPECT_EQ(Current(SIGUSR2).sa_handler, SIG_IGN);
  SetDisposition(SIGUSR2, SIG_DFL);
  set_log_enabled(true);
}

TEST(SnapshotSignal, RestoreKeepsAHandlerTheProgramInstalledAfterUs) {
  SetDisposition(SIGUSR1, SIG_DFL);
  sem_t wake;
  sem_init(&wake, 0, 0);
  ASSERT_TRUE(install_snapshot_signal(SIGUSR1, &wake));
  SetDisposition(SIGUSR1, ProgramHandler);
  restore_snapshot_signal();
  EXPECT_EQ(Current(SIGUSR1).sa_handler, ProgramHandler);
  SetDisposition(SIGUSR1, SIG_DFL);
}

}  // namespace
}  // namespace gpushim
