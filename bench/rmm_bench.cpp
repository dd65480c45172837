// RMM's memory resources on the same loop as alloc_bench's `pair/<api>/fixed_<size>` (issue 30):
// allocate + deallocate of one size on one stream, one pair per iteration, p50/p99 of per-pair
// steady_clock samples with the clock's own cost subtracted (latency_samples.h), `--frames` calls
// deep, the stream synchronized every 1024 pairs outside the timed part. Built only when
// GPUSHIM_RMM_SOURCE names RMM's sources (bench/rmm.md says how); host code, no nvcc, linked to
// the simulated libcudart.so.13 without an RPATH like alloc_bench, so LD_LIBRARY_PATH picks the
// runtime. It never runs under the shim: RMM calls the runtime directly.
//
//   pair/sync/fixed_4KiB    allocate(n, default stream) + deallocate: the stream cudaMalloc and
//                           cudaFree are ordered on, what alloc_bench's plain pair calls
//   pair/async/fixed_4KiB   the same on a cudaStreamNonBlocking stream, as alloc_bench's
//                           cudaMallocAsync+cudaFreeAsync pair
//
// Options (before Google Benchmark's --benchmark_* flags):
//   --resource=arena|pool|async|cuda   arena_memory_resource<cuda_memory_resource> (default arena
//                                      size: half the free memory), pool_memory_resource<
//                                      cuda_memory_resource> (initial pool: half the free memory),
//                                      cuda_async_memory_resource (defaults), or cuda_memory_resource
//                                      itself (cudaMalloc/cudaFree through RMM's interface)
//   --sizes=4096,...   fixed sizes, bytes (default 4096)
//   --apis=sync,async  (default both)
//   --frames=N         call depth under each benchmark (default 72, as alloc_bench)
//   --iterations=N     a fixed iteration count instead of Google Benchmark's timing
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <rmm/cuda_device.hpp>
#include <rmm/cuda_stream_view.hpp>
#include <rmm/mr/device/arena_memory_resource.hpp>
#include <rmm/mr/device/cuda_async_memory_resource.hpp>
#include <rmm/mr/device/cuda_memory_resource.hpp>
#include <rmm/mr/device/device_memory_resource.hpp>
#include <rmm/mr/device/pool_memory_resource.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_options.h"
#include "call_depth.h"
#include "latency_samples.h"

namespace {

using gpushim_bench::Clock;
using gpushim_bench::ns_between;
using gpushim_bench::size_label;
using gpushim_bench::split;

struct Options {
  std::string resource = "arena";
  std::vector<size_t> sizes{4096};
  std::vector<std::string> apis{"sync", "async"};
  int frames = 72;
  int64_t iterations = 0;
};

bool parse_options(int* argc, char** argv, Options* o) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) { return gpushim_bench::option_value(argv[i], name); };
    if (const char* v = value("--resource=")) {
      o->resource = v;
    } else if (const char* v = value("--sizes=")) {
      o->sizes.clear();
      for (const auto& s : split(v)) o->sizes.push_back(std::strtoull(s.c_str(), nullptr, 10));
    } else if (const char* v = value("--apis=")) {
      o->apis = split(v);
    } else if (const char* v = value("--frames=")) {
      o->frames = std::atoi(v);
    } else if (const char* v = value("--iterations=")) {
      o->iterations = std::atoll(v);
    } else if (a.rfind("--benchmark", 0) == 0 || a == "--help") {
      argv[kept++] = argv[i];
    } else {
      std::fprintf(stderr, "rmm_bench: unknown option %s\n", argv[i]);
      return false;
    }
  }
  for (const auto& api : o->apis)
    if (api != "sync" && api != "async") return false;
  const auto& r = o->resource;
  if (r != "arena" && r != "pool" && r != "async" && r != "cuda") return false;
  *argc = kept;
  return true;
}

gpushim_bench::LatencySamples g_samples;

// The resource under test and the upstream it draws from (both live for the whole process).
struct Resource {
  std::unique_ptr<rmm::mr::cuda_memory_resource> cuda;
  std::unique_ptr<rmm::mr::device_memory_resource> top;
};

Resource make_resource(const std::string& name) {
  Resource r;
  r.cuda = std::make_unique<rmm::mr::cuda_memory_resource>();
  if (name == "arena") {
    r.top = std::make_unique<rmm::mr::arena_memory_resource<rmm::mr::cuda_memory_resource>>(r.cuda.get());
  } else if (name == "pool") {
    r.top = std::make_unique<rmm::mr::pool_memory_resource<rmm::mr::cuda_memory_resource>>(
        r.cuda.get(), rmm::percent_of_free_device_memory(50));
  } else if (name == "async") {
    r.top = std::make_unique<rmm::mr::cuda_async_memory_resource>();
  }
  return r;
}

void pair_benchmark(benchmark::State& state, rmm::mr::device_memory_resource* mr, bool async, size_t n,
                    int frames) {
  cudaStream_t raw = nullptr;
  if (async) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking)) {
      state.SkipWithError((std::string("stream: ") + cudaGetErrorName(e)).c_str());
      return;
    }
  }
  const rmm::cuda_stream_view stream{raw};  // 0: the legacy default stream
  g_samples.begin(state);
  size_t i = 0;
  uint64_t queued_bytes = 0;
  auto loop = [&] {
    try {
      for (auto _ : state) {
        ++i;
        const auto t0 = Clock::now();
        void* p = mr->allocate(n, stream);
        mr->deallocate(p, n, stream);
        const auto t1 = Clock::now();
        g_samples.add(state, ns_between(t0, t1));
        // As alloc_bench: bounds the work queued on the stream, outside the timed part.
        if (async && ((queued_bytes += n) >= (1ull << 30) || (i & 1023) == 0)) {
          stream.synchronize();
          queued_bytes = 0;
        }
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  };
  gpushim_bench::at_depth(frames, loop);
  g_samples.publish(state);
  if (raw) {
    cudaStreamSynchronize(raw);
    cudaStreamDestroy(raw);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse_options(&argc, argv, &opt)) {
    std::fprintf(stderr, "usage: %s [--resource=arena|pool|async|cuda] [--sizes=N,..] [--apis=sync,async] "
                         "[--frames=N] [--iterations=N] [--benchmark_*]\n", argv[0]);
    return 2;
  }
  // Create the context before anything is timed, as alloc_bench does.
  if (cudaError_t e = cudaFree(nullptr)) {
    std::fprintf(stderr, "rmm_bench: no CUDA device: %s\n", cudaGetErrorName(e));
    return 1;
  }
  Resource res;
  try {
    res = make_resource(opt.resource);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rmm_bench: cannot make the %s resource: %s\n", opt.resource.c_str(), e.what());
    return 1;
  }
  rmm::mr::device_memory_resource* mr = res.top ? res.top.get() : res.cuda.get();
  for (const auto& api : opt.apis) {
    for (size_t n : opt.sizes) {
      const std::string name = "pair/" + api + "/fixed_" + size_label(n);
      const bool async = api == "async";
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [mr, async, n, frames = opt.frames](benchmark::State& st) {
        pair_benchmark(st, mr, async, n, frames);
      });
      b->UseRealTime();
      if (opt.iterations > 0) b->Iterations(opt.iterations);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("rmm_resource", opt.resource);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
