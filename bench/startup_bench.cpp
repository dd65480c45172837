// Start-up cost of the preload in a process that never touches CUDA: /bin/true spawned with and
// without LD_PRELOAD=libgpushim.so, alternating within one run so that drift in machine load hits
// both sides alike. Reports the median of each side and their ratio.
//
// Usage: startup_bench --shim=/path/to/libgpushim.so [--program=/bin/true] [--benchmark_*]
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "latency_samples.h"

extern char** environ;

namespace {

using gpushim_bench::Clock;
using gpushim_bench::ns_between;

std::string g_shim, g_program = "/bin/true";

// The current environment without LD_PRELOAD and GPUSHIM_*, plus `preload` when given.
std::vector<std::string> child_env(const std::string& preload) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 || std::strncmp(*e, "GPUSHIM_", 8) == 0) continue;
    env.emplace_back(*e);
  }
  if (!preload.empty()) env.push_back("LD_PRELOAD=" + preload);
  return env;
}

// Spawns the program and waits; returns wall nanoseconds, or 0 if it did not exit with 0.
uint64_t spawn_once(std::vector<char*>& envp) {
  char* argv[] = {const_cast<char*>(g_program.c_str()), nullptr};
  const auto t0 = Clock::now();
  pid_t pid;
  if (posix_spawn(&pid, g_program.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return 0;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 0;
  return ns_between(t0, Clock::now());
}

double median(std::vector<uint64_t> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return static_cast<double>(v[v.size() / 2]);
}

void startup(benchmark::State& state) {
  std::vector<std::string> plain_env = child_env(""), preload_env = child_env(g_shim);
  auto pointers = [](std::vector<std::string>& env) {
    std::vector<char*> p;
    for (auto& s : env) p.push_back(s.data());
    p.push_back(nullptr);
    return p;
  };
  std::vector<char*> plain = pointers(plain_env), preloaded = pointers(preload_env);
  std::vector<uint64_t> plain_ns, preload_ns;
  bool flip = false;
  for (auto _ : state) {
    // Alternate which side goes first, so neither always runs on a warmer cache.
    flip = !flip;
    const uint64_t a = spawn_once(flip ? plain : preloaded);
    const uint64_t b = spawn_once(flip ? preloaded : plain);
    if (a == 0 || b == 0) {
      state.SkipWithError("spawn failed or the program did not exit with 0");
      break;
    }
    plain_ns.push_back(flip ? a : b);
    preload_ns.push_back(flip ? b : a);
  }
  if (plain_ns.empty()) return;
  const double p = median(plain_ns), q = median(preload_ns);
  state.counters["plain_p50_us"] = p / 1e3;
  state.counters["preload_p50_us"] = q / 1e3;
  state.counters["ratio"] = q / p;
  state.counters["spawns_each"] = static_cast<double>(plain_ns.size());
}

}  // namespace

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--shim=", 7) == 0) g_shim = argv[i] + 7;
    else if (std::strncmp(argv[i], "--program=", 10) == 0) g_program = argv[i] + 10;
    else argv[kept++] = argv[i];
  }
  argc = kept;
  if (g_shim.empty()) {
    std::fprintf(stderr, "usage: %s --shim=/path/to/libgpushim.so [--program=/bin/true] [--benchmark_*]\n", argv[0]);
    return 2;
  }
  benchmark::RegisterBenchmark("startup/bin_true", startup)->UseRealTime()->MinTime(1.0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
