// Start-up cost of the preload in a process that never touches CUDA: /bin/true spawned with and
// without LD_PRELOAD=libgpushim.so, alternating within one run so that drift in machine load hits
// both sides alike. Reports the median of each side and their ratio.
//
// Usage: startup_bench --shim=/path/to/libgpushim.so [--program=/bin/true] [--arg=A ...] [--benchmark_*]
//   --arg=A   an argument for the program, repeatable (python3 --arg=-c --arg=pass)
// Each iteration is one pair of spawns; Google Benchmark's --benchmark_min_iters is not in
// Debian 12's version, so ask for >= 30 pairs with --benchmark_min_time (or --iterations=N).
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "latency_samples.h"

extern char** environ;

namespace {

using gpushim_bench::Clock;
using gpushim_bench::ns_between;

std::string g_shim, g_program = "/bin/true";
std::vector<std::string> g_args;
int64_t g_iterations = 0;  // 0: Google Benchmark decides

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

// Spawns the program and waits; returns wall nanoseconds, or 0 if it did not exit with 0, and
// the child's CPU time (user + system) in `cpu_ns`: on a machine shared with builds the wall time
// of a 1 ms process is mostly waiting for a core, its CPU time much less so.
uint64_t spawn_once(std::vector<char*>& envp, uint64_t* cpu_ns) {
  std::vector<char*> argv{const_cast<char*>(g_program.c_str())};
  for (auto& a : g_args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto t0 = Clock::now();
  pid_t pid;
  if (posix_spawnp(&pid, g_program.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return 0;
  int status = 0;
  struct rusage ru {};
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 0;
  const uint64_t wall = ns_between(t0, Clock::now());
  auto ns = [](const timeval& t) { return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + t.tv_usec * 1000ull; };
  *cpu_ns = ns(ru.ru_utime) + ns(ru.ru_stime);
  return wall;
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
  std::vector<uint64_t> plain_ns, preload_ns, plain_cpu, preload_cpu;
  bool flip = false;
  for (auto _ : state) {
    // Alternate which side goes first, so neither always runs on a warmer cache.
    flip = !flip;
    uint64_t a_cpu = 0, b_cpu = 0;
    const uint64_t a = spawn_once(flip ? plain : preloaded, &a_cpu);
    const uint64_t b = spawn_once(flip ? preloaded : plain, &b_cpu);
    if (a == 0 || b == 0) {
      state.SkipWithError("spawn failed or the program did not exit with 0");
      break;
    }
    plain_ns.push_back(flip ? a : b);
    preload_ns.push_back(flip ? b : a);
    plain_cpu.push_back(flip ? a_cpu : b_cpu);
    preload_cpu.push_back(flip ? b_cpu : a_cpu);
  }
  if (plain_ns.empty()) return;
  const double p = median(plain_ns), q = median(preload_ns);
  state.counters["plain_p50_us"] = p / 1e3;
  state.counters["preload_p50_us"] = q / 1e3;
  state.counters["ratio"] = q / p;
  const double pc = median(plain_cpu), qc = median(preload_cpu);
  state.counters["plain_cpu_p50_us"] = pc / 1e3;
  state.counters["preload_cpu_p50_us"] = qc / 1e3;
  state.counters["cpu_ratio"] = pc > 0 ? qc / pc : 0;
  state.counters["spawns_each"] = static_cast<double>(plain_ns.size());
}

}  // namespace

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--shim=", 7) == 0) g_shim = argv[i] + 7;
    else if (std::strncmp(argv[i], "--program=", 10) == 0) g_program = argv[i] + 10;
    else if (std::strncmp(argv[i], "--arg=", 6) == 0) g_args.emplace_back(argv[i] + 6);
    else if (std::strncmp(argv[i], "--iterations=", 13) == 0) g_iterations = std::strtoll(argv[i] + 13, nullptr, 10);
    else argv[kept++] = argv[i];
  }
  argc = kept;
  if (g_shim.empty()) {
    std::fprintf(stderr, "usage: %s --shim=/path/to/libgpushim.so [--program=/bin/true] [--benchmark_*]\n", argv[0]);
    return 2;
  }
  // The name says what ran: startup/bin_true as before, startup/python3_-c_pass and so on.
  std::string name = g_program.substr(g_program.rfind('/') + 1);
  for (const auto& a : g_args) name += "_" + a;
  auto* b = benchmark::RegisterBenchmark(("startup/" + (name == "true" ? std::string("bin_true") : name)).c_str(), startup);
  b->UseRealTime();
  if (g_iterations > 0) b->Iterations(g_iterations);
  else b->MinTime(1.0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
