// The lock of a pool: every allocation and free takes it once, for a few dozen nanoseconds.
//
// Why not std::mutex: its unlock is an atomic read-modify-write (it must learn whether anyone
// sleeps), and in the VMs our benchmarks run in each lock-prefixed instruction costs about 12 ns:
// a tenth of a pooled alloc+free pair. Here unlocking is a plain release store, and sleepers are
// counted in a word of their own that unlock only reads.
//
// The price of that read: it may pass the store (x86 lets a load overtake an earlier store to
// another address), so a thread about to sleep can miss its wake-up. Sleeps are therefore bounded
// (kSleepBound) and re-checked: a missed wake-up, which needs that narrow race, costs at most one
// bound of latency and never a hang. Contended, a waiter first spins briefly (the holder is
// usually about to leave), then sleeps in the kernel, so a preempted or long holder (a device
// synchronization under the lock) costs waiters no CPU.
//
// Not recursive. A lock held at fork stays held in the child, as with std::mutex; the shim does
// not use its pools in a fork child.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace gpushim {

class FutexMutex {
 public:
  FutexMutex() = default;
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;

  void lock() {
    if (__builtin_expect(!try_lock(), 0)) lock_contended();
  }
  bool try_lock() {
    uint32_t expected = 0;
    return locked_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    locked_.store(0, std::memory_order_release);
    if (__builtin_expect(sleepers_.load(std::memory_order_relaxed) != 0, 0)) wake_one();
  }

  // How long a sleeping waiter waits before it looks again on its own (see above).
  static constexpr long kSleepBoundNs = 200 * 1000;
  // Spins before sleeping. Few: on a machine with few cores a spinning waiter mostly keeps the
  // holder's cache lines moving between cores.
  static constexpr int kSpins = 16;

 private:
  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  __attribute__((noinline)) void lock_contended() {
    for (int spin = 0; spin < kSpins; ++spin) {
      cpu_relax();
      if (locked_.load(std::memory_order_relaxed) == 0 && try_lock()) return;
    }
    for (;;) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      const bool got = try_lock();  // after announcing: an unlock from here on sees the sleeper
      if (!got) {
        const timespec bound{0, kSleepBoundNs};
        // Sleeps only while the word still reads "locked"; returns at once otherwise.
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&locked_), FUTEX_WAIT_PRIVATE, 1u, &bound, nullptr, 0);
        waking_.store(false, std::memory_order_relaxed);
      }
      // The last sleeper to leave also clears the flag: a wake-up sent as it timed out reached
      // nobody, and would otherwise hold back the next sleeper's wake-up for one bound.
      if (sleepers_.fetch_sub(1, std::memory_order_relaxed) == 1) waking_.store(false, std::memory_order_relaxed);
      if (got || try_lock()) return;
    }
  }
  __attribute__((noinline)) void wake_one() {
    // One wake-up in flight is enough: until the woken thread runs, further unlocks would only
    // pay a system call each to wake nobody new (the holder may take and leave the lock many
    // times meanwhile). Racy by design; what a lost race can cost is bounded as said above.
    if (waking_.load(std::memory_order_relaxed)) return;
    waking_.store(true, std::memory_order_relaxed);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&locked_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

  std::atomic<uint32_t> locked_{0};  // the futex word: 1 while held
  std::atomic<uint32_t> sleepers_{0};  // threads between announcing a sleep and returning from it
  std::atomic<bool> waking_{false};    // a wake-up was sent and its thread has not run yet
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "the futex word is the atomic itself");
};

}  // namespace gpushim
