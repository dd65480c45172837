// Allocation latency through the real path: a CUDA program linked to libcudart.so.13 (the
// simulated one here, NVIDIA's on a GPU), run as is (a direct call into the runtime) or under
// LD_PRELOAD=libgpushim.so with GPUSHIM_POLICY / GPUSHIM_STACK_DEPTH chosen by the caller
// (scripts/bench, scripts/gpu-validate). The program never knows which: it measures calls.
//
//   pair/<api>/<sizes>   cudaMalloc+cudaFree (sync) or cudaMallocAsync+cudaFreeAsync on a created
//                        non-blocking stream (async) or on the legacy default stream, PyTorch's
//                        default (async_legacy), one pair per iteration, fixed or random sizes;
//                        p50/p99 per pair.
//   replay/training_step a mixed-size pattern (bench/workloads.h) replayed op by op; p50/p99 per
//                        op and ops per second.
//
// Every benchmark runs `--frames` calls deep (default 72) so that stack capture at depth 32 or 64
// walks that many real frames.
//
// Options (before Google Benchmark's own --benchmark_* flags, which are accepted too):
//   --sizes=4096,1048576   fixed sizes, bytes (default 4096)
//   --random=1|0           also random sizes, log-uniform 256 B .. 4 MiB (default 1)
//   --threads=1,2          thread counts (default 1,2)
//   --apis=sync,async      (default sync,async; async_legacy too on request)
//   --replay=1|0           the training-step replay (default 1)
//   --frames=N             call depth under each benchmark (default 72)
//   --iterations=N         a fixed iteration count instead of Google Benchmark's timing (for
//                          profiling under callgrind or perf)
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_options.h"
#include "call_depth.h"
#include "latency_samples.h"
#include "workloads.h"

namespace {

using gpushim_bench::Clock;
using gpushim_bench::ns_between;
using gpushim_bench::size_label;
using gpushim_bench::split;

struct Options {
  std::vector<size_t> sizes{4096};
  bool random = true;
  std::vector<int> threads{1, 2};
  std::vector<std::string> apis{"sync", "async"};
  bool replay = true;
  int frames = 72;
  int64_t iterations = 0;  // 0: let Google Benchmark decide
};

// Takes our options out of argv, leaving Google Benchmark's. Returns false on a bad option.
bool parse_options(int* argc, char** argv, Options* o) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) { return gpushim_bench::option_value(argv[i], name); };
    if (const char* v = value("--sizes=")) {
      o->sizes.clear();
      for (const auto& s : split(v)) o->sizes.push_back(std::strtoull(s.c_str(), nullptr, 10));
    } else if (const char* v = value("--random=")) {
      o->random = std::strcmp(v, "0") != 0;
    } else if (const char* v = value("--threads=")) {
      o->threads.clear();
      for (const auto& s : split(v)) o->threads.push_back(std::atoi(s.c_str()));
    } else if (const char* v = value("--apis=")) {
      o->apis = split(v);
    } else if (const char* v = value("--replay=")) {
      o->replay = std::strcmp(v, "0") != 0;
    } else if (const char* v = value("--frames=")) {
      o->frames = std::atoi(v);
    } else if (const char* v = value("--iterations=")) {
      o->iterations = std::atoll(v);
    } else if (a.rfind("--benchmark", 0) == 0 || a == "--help") {
      argv[kept++] = argv[i];
    } else {
      std::fprintf(stderr, "alloc_bench: unknown option %s\n", argv[i]);
      return false;
    }
  }
  for (int t : o->threads)
    if (t < 1 || t > gpushim_bench::LatencySamples::kMaxThreads) return false;
  for (const auto& api : o->apis)
    if (api != "sync" && api != "async" && api != "async_legacy") return false;
  *argc = kept;
  return true;
}

gpushim_bench::LatencySamples g_samples;

// Log-uniform 256 B .. 4 MiB, the same sequence in every run; each thread starts at its own offset.
const std::vector<size_t>& random_sizes() {
  static const std::vector<size_t> sizes = [] {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(4.0 * (1 << 20)));
    std::vector<size_t> v(4096);
    for (auto& s : v) s = static_cast<size_t>(std::exp(log_size(rng)));
    return v;
  }();
  return sizes;
}

void fail(benchmark::State& state, const char* what, cudaError_t e) {
  const std::string msg = std::string(what) + ": " + cudaGetErrorName(e);
  state.SkipWithError(msg.c_str());
}

void pair_benchmark(benchmark::State& state, bool async, bool legacy, std::vector<size_t> sizes, int frames) {
  cudaStream_t stream = nullptr;  // the legacy default stream
  if (async && !legacy) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) return fail(state, "stream", e);
  }
  g_samples.begin(state);
  size_t i = static_cast<size_t>(state.thread_index()) * 997;
  const size_t count = sizes.size();
  uint64_t queued_bytes = 0;  // freed on the stream since its last synchronization
  auto loop = [&] {
    for (auto _ : state) {
      const size_t n = sizes[i++ % count];
      void* p = nullptr;
      const auto t0 = Clock::now();
      const cudaError_t e1 = async ? cudaMallocAsync(&p, n, stream) : cudaMalloc(&p, n);
      const cudaError_t e2 = async ? cudaFreeAsync(p, stream) : cudaFree(p);
      const auto t1 = Clock::now();
      if (e1 != cudaSuccess || e2 != cudaSuccess) {
        fail(state, e1 != cudaSuccess ? "alloc" : "free", e1 != cudaSuccess ? e1 : e2);
        break;
      }
      g_samples.add(state, ns_between(t0, t1));
      // Bounds the work queued on the stream, outside the timed part: the simulated device frees
      // stream-ordered memory only when its stream worker gets there, and a loop of nothing but
      // allocations outruns it (as a real program with kernels between its calls would not).
      if (async && ((queued_bytes += n) >= (1ull << 30) || (i & 1023) == 0)) {
        cudaStreamSynchronize(stream);
        queued_bytes = 0;
      }
    }
  };
  gpushim_bench::at_depth(frames, loop);
  g_samples.publish(state);
  if (stream) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

// Sequence lengths cycled by the replay: the shape of the step changes every iteration.
const gpushim_bench::EventSequence& replay_pattern() {
  static const gpushim_bench::EventSequence seq = [] {
    gpushim_bench::EventSequence s;
    for (uint64_t len : {256u, 512u, 384u, 1024u, 128u, 768u}) gpushim_bench::training_step(s, len);
    return s;
  }();
  return seq;
}

void replay_benchmark(benchmark::State& state, int frames) {
  const auto& events = replay_pattern().events();
  std::vector<void*> slots(replay_pattern().slots(), nullptr);
  g_samples.begin(state, events.size());
  auto loop = [&] {
    for (auto _ : state) {
      for (const auto& ev : events) {
        const auto t0 = Clock::now();
        const cudaError_t e = ev.alloc ? cudaMalloc(&slots[ev.slot], ev.size) : cudaFree(slots[ev.slot]);
        const auto t1 = Clock::now();
        if (e != cudaSuccess) return fail(state, ev.alloc ? "alloc" : "free", e);
        g_samples.add(state, ns_between(t0, t1));
      }
    }
  };
  gpushim_bench::at_depth(frames, loop);
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(events.size()));
  g_samples.publish(state);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse_options(&argc, argv, &opt)) {
    std::fprintf(stderr, "usage: %s [--sizes=N,..] [--random=0|1] [--threads=1,2] [--apis=sync,async,async_legacy] "
                         "[--replay=0|1] [--frames=N] [--benchmark_*]\n", argv[0]);
    return 2;
  }
  // Create the context before anything is timed.
  if (cudaError_t e = cudaFree(nullptr)) {
    std::fprintf(stderr, "alloc_bench: no CUDA device: %s\n", cudaGetErrorName(e));
    return 1;
  }
  std::vector<std::pair<std::string, std::vector<size_t>>> size_sets;
  for (size_t n : opt.sizes) size_sets.push_back({"fixed_" + size_label(n), {n}});
  if (opt.random) size_sets.push_back({"random", random_sizes()});
  for (const auto& api : opt.apis) {
    for (const auto& [label, sizes] : size_sets) {
      const std::string name = "pair/" + api + "/" + label;
      const bool async = api != "sync";
      const bool legacy = api == "async_legacy";
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [async, legacy, sizes = sizes, frames = opt.frames](
                                                               benchmark::State& st) {
        pair_benchmark(st, async, legacy, sizes, frames);
      });
      for (int t : opt.threads) b->Threads(t);
      b->UseRealTime();
      if (opt.iterations > 0) b->Iterations(opt.iterations);
    }
  }
  if (opt.replay) {
    auto* b = benchmark::RegisterBenchmark("replay/training_step",
                                           [frames = opt.frames](benchmark::State& st) { replay_benchmark(st, frames); });
    for (int t : opt.threads) b->Threads(t);
    b->UseRealTime();
    if (opt.iterations > 0) b->Iterations(opt.iterations);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
