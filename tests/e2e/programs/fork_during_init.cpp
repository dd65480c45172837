// fork() while another thread makes the process's first CUDA call, i.e. while the shim
// initializes. The child must never inherit the initialization lock held: it would block in its
// own first CUDA call forever. (It did, about once in 40 runs of python/fork_while_allocating.py:
// the fork handlers were registered under that lock, so a fork that began just before they were
// registered ran none of them and copied the lock held.)
//
// Each round runs in a fresh process (a child of this one, which never calls CUDA itself), where
// CUDA is already initialized: a thread makes the first cudaMalloc (the shim's first call) while
// the main thread forks after a delay that sweeps the shim's initialization window; the grandchild calls cudaMalloc (any answer will do; it must return) and
// exits. A grandchild that has not exited within 10 s is counted as hung and killed.
//
// Usage: e2e_fork_during_init ROUNDS     prints {"rounds":N,"hung":H}; exits 1 if H > 0
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "support/test_support.h"

namespace {

// 0: the grandchild exited; 1: it hung (killed); 2: something else went wrong.
int round_in_fresh_process(unsigned delay_us) {
  // The runtime and the device start first, through calls the shim does not hook: a fork while
  // CUDA itself initializes (its dlopen, its once-flags) is CUDA's business, not the shim's.
  if (cudaSetDevice(0) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;
  std::thread first([] {
    void* p = nullptr;
    if (cudaMalloc(&p, 4096) == cudaSuccess) cudaFree(p);
  });
  if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    void* p = nullptr;
    (void)cudaMalloc(&p, 4096);  // CUDA refuses it in a fork child of a CUDA process; it must return
    _exit(0);
  }
  int rc = 1;
  for (int waited_ms = 0; waited_ms < 10000; waited_ms += 5) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) {
      rc = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 2;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (rc == 1) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  first.join();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
  int hung = 0, failed = 0;
  for (int i = 0; i < rounds; ++i) {
    const pid_t runner = fork();
    if (runner < 0) return 2;
    if (runner == 0) _exit(round_in_fresh_process(static_cast<unsigned>(i % 50) * 20));
    int status = 0;
    waitpid(runner, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
    hung += rc == 1;
    failed += rc == 2;
  }
  std::printf("{\"rounds\":%d,\"hung\":%d,\"failed\":%d}\n", rounds, hung, failed);
  return hung || failed ? 1 : 0;
}
