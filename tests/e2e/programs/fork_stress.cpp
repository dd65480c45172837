// fork() at any moment: worker threads allocate and free without pause (so some are always inside
// the shim, holding its locks) while the main thread forks again and again. Each child asks the
// shim for its figures and tries a cudaMalloc (CUDA cannot work in the child of a CUDA process, so
// it must get CUDA's own error, not a block from the parent's pool), then exits, half of them with
// exit() (atexit handlers run) and half with _exit(); the first fork comes before any device memory
// exists. A child that does not finish within 20 s is counted as hung and killed. At the end the
// workers free everything; the shim must agree exactly.
//
// Usage: e2e_fork_stress THREADS FORKS
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.h"

namespace {

std::atomic<bool> g_stop{false};
bool g_in_child = false;
std::atomic<long> g_allocs{0}, g_frees{0}, g_errors{0};

void worker(int id) {
  std::mt19937_64 rng(id + 1);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::pair<void*, bool>> held;  // pointer, stream-ordered
  gpushim_device_stats st;
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (held.size() < 8 && rng() % 3 != 0) {
      void* p = nullptr;
      const size_t size = 1 + rng() % (3 << 20);
      const bool async = rng() % 2;
      const cudaError_t e = async ? cudaMallocAsync(&p, size, stream) : cudaMalloc(&p, size);
      if (e != cudaSuccess) {
        g_errors++;
        continue;
      }
      g_allocs++;
      held.emplace_back(p, async);
    } else if (!held.empty()) {
      const size_t k = rng() % held.size();
      const cudaError_t e = held[k].second ? cudaFreeAsync(held[k].first, stream) : cudaFree(held[k].first);
      if (e != cudaSuccess) g_errors++;
      g_frees++;
      held[k] = held.back();
      held.pop_back();
    }
    if (rng() % 16 == 0) testsupport::shim_stats(0, &st);  // takes the pool's lock
  }
  for (auto& [p, async] : held) {
    if ((async ? cudaFreeAsync(p, stream) : cudaFree(p)) != cudaSuccess) g_errors++;
    g_frees++;
  }
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaStreamDestroy(stream));
}

// What the child reports back through the pipe: the shim's answer and cudaMalloc's.
[[noreturn]] void child(int fd, bool use_exit) {
  gpushim_device_stats st;
  const int stats = testsupport::shim_stats(0, &st) ? 0 : -1;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, 4096);
  if (e == cudaSuccess) cudaFree(p);
  std::vector<char> heap(1 << 16, 1);  // the allocator must work too
  const std::string line = std::to_string(stats) + " " + cudaGetErrorName(e) + "\n";
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(3);
  if (use_exit) std::exit(heap[100] == 1 ? 0 : 4);
  _exit(heap[100] == 1 ? 0 : 4);
}

}  // namespace

// LeakSanitizer (ASan builds) calls this at exit. A fork child of a multi-threaded process cannot
// see the other threads' stacks, so everything they hold would look leaked: only the parent's leak
// check means something.
extern "C" int __lsan_is_turned_off() { return g_in_child ? 1 : 0; }

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 8;
  const int forks = argc > 2 ? std::atoi(argv[2]) : 100;
  CHECK(cudaFree(nullptr));
  int hung = 0, bad_exit = 0;
  std::set<std::string> answers;
  auto fork_once = [&](int i) {
    int fds[2];
    if (pipe(fds) != 0) std::exit(2);
    const pid_t pid = fork();
    if (pid < 0) std::exit(2);
    if (pid == 0) {
      g_in_child = true;
      close(fds[0]);
      child(fds[1], i % 2 == 0);
    }
    close(fds[1]);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        hung++;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      usleep(200);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad_exit++;
    char buf[128] = {0};
    const ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    if (n > 0) answers.insert(std::string(buf, static_cast<size_t>(n) - 1));
  };
  // The first fork comes after CUDA is initialized but before any device memory exists.
  fork_once(0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (int i = 1; i < forks; ++i) fork_once(i);
  g_stop = true;
  for (auto& th : pool) th.join();
  std::printf("{\"forks\":%d,\"hung\":%d,\"bad_exit\":%d,\"allocs\":%ld,\"frees\":%ld,\"errors\":%ld,\"child_answers\":[",
              forks, hung, bad_exit, g_allocs.load(), g_frees.load(), g_errors.load());
  size_t k = 0;
  for (const std::string& a : answers) std::printf("%s\"%s\"", k++ ? "," : "", a.c_str());
  std::printf("]}\n");
  return 0;
}
