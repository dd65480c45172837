// Process patterns around fork and exec, as a PyTorch job produces them.
//
// Usage: e2e_dataloader MODE WORKERS [PROGRAM]
//   parent-first  The parent uses the device ("the model"), then forks WORKERS that only do CPU work
//                 (DataLoader workers) and send a result back; half exit with exit(), half with
//                 _exit(). The parent keeps training afterwards and leaks its model block (1 MiB).
//   fork-first    The parent forks WORKERS before it touches CUDA; each worker is a CUDA process of
//                 its own and leaks (1 + index) MiB from worker_main; then the parent leaks 1 MiB.
//   exec          The parent uses the device, then forks and execs PROGRAM, which uses CUDA.
// Prints a JSON line with the pids and what the workers sent.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace {

void* g_model = nullptr;
bool g_forked_worker = false;

__attribute__((noinline)) void* allocate_model() {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 1 << 20));
  CHECK(cudaMemset(p, 7, 1 << 20));
  return p;
}

__attribute__((noinline)) void train_step() {
  void* act = nullptr;
  CHECK(cudaMalloc(&act, 4 << 20));
  CHECK(cudaMemset(act, 1, 4 << 20));
  CHECK(cudaFree(act));
}

// A DataLoader worker: CPU only.
long cpu_batch(int index) {
  std::vector<long> data(100000);
  long sum = 0;
  for (size_t i = 0; i < data.size(); ++i) sum += data[i] = static_cast<long>(i) * (index + 1);
  return sum;
}

__attribute__((noinline)) void worker_main(int index) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, static_cast<size_t>(1 + index) << 20));  // leaked: the worker's report shows it
  CHECK(cudaMemset(p, index, static_cast<size_t>(1 + index) << 20));
}

int wait_all(const std::vector<pid_t>& pids) {
  int bad = 0;
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
  }
  return bad;
}

}  // namespace

// LeakSanitizer (ASan builds) calls this at exit. A worker forked from a process whose CUDA runtime
// runs threads cannot see those threads' stacks, so what they hold would look leaked.
extern "C" int __lsan_is_turned_off() { return g_forked_worker ? 1 : 0; }

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[1];
  const int workers = std::atoi(argv[2]);
  std::vector<pid_t> pids;
  std::string sent;
  int bad = 0;
  if (mode == "parent-first") {
    g_model = allocate_model();
    train_step();
    for (int i = 0; i < workers; ++i) {
      int fds[2];
      if (pipe(fds) != 0) return 2;
      const pid_t pid = fork();
      if (pid == 0) {
        g_forked_worker = true;
        close(fds[0]);
        const std::string line = std::to_string(cpu_batch(i));
        if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(3);
        if (i % 2 == 0) std::exit(0);
        _exit(0);
      }
      close(fds[1]);
      char buf[64] = {0};
      const ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
      close(fds[0]);
      if (n > 0) sent += std::string(sent.empty() ? "" : ",") + buf;
      pids.push_back(pid);
    }
    bad = wait_all(pids);
    train_step();
  } else if (mode == "fork-first") {
    for (int i = 0; i < workers; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        worker_main(i);
        return 0;  // return from main in the child: its report is written at exit
      }
      pids.push_back(pid);
    }
    bad = wait_all(pids);
    g_model = allocate_model();
  } else if (mode == "exec" && argc > 3) {
    g_model = allocate_model();
    const pid_t pid = fork();
    if (pid == 0) {
      execl(argv[3], argv[3], static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
    bad = wait_all(pids);
  } else {
    return 2;
  }
  std::printf("{\"pid\":%d,\"children\":[", static_cast<int>(getpid()));
  for (size_t i = 0; i < pids.size(); ++i) std::printf("%s%d", i ? "," : "", static_cast<int>(pids[i]));
  std::printf("],\"bad_children\":%d,\"sent\":[%s]}\n", bad, sent.c_str());
  return 0;
}
