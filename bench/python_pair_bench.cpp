// Allocation pairs from a repeated call site under Python frames (issue 30, "stacks that cost what
// a cache lookup costs"): python_stacks_bench.py loads this library with ctypes and calls it from
// 20 Python frames without the GIL, as PyTorch allocates; it then calls cudaMalloc+cudaFree (or
// cudaMallocAsync+cudaFreeAsync) `native_frames` calls deeper, so that the shim, preloaded or not,
// sees a native stack that deep under the Python frames. Each pair is timed on its own (p50), so
// ctypes' cost, which the end-to-end figures of the same script include, is not in it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "call_depth.h"

namespace {

using Clock = std::chrono::steady_clock;

uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

uint64_t median(std::vector<uint64_t>& v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

// api: 0 = cudaMalloc+cudaFree, 1 = cudaMallocAsync+cudaFreeAsync on one stream. Writes the p50
// and p99 per pair in ns (the clock's own cost subtracted) and returns 0, or a CUDA error code.
extern "C" __attribute__((visibility("default"))) int python_pair_bench(int api, int native_frames, int pairs,
                                                                        double* p50, double* p99) {
  cudaStream_t stream = nullptr;
  if (api == 1 && cudaStreamCreate(&stream) != cudaSuccess) return 1;
  std::vector<uint64_t> clock_cost(10001), samples(static_cast<size_t>(pairs));
  for (auto& x : clock_cost) {
    const auto a = Clock::now();
    const auto b = Clock::now();
    x = ns_between(a, b);
  }
  const uint64_t overhead = median(clock_cost);
  int err = 0;
  auto run = [&] {
    void* p = nullptr;
    auto pair = [&] {
      if (api == 1) {
        if (cudaMallocAsync(&p, 4096, stream) != cudaSuccess || cudaFreeAsync(p, stream) != cudaSuccess) err = 2;
      } else if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) {
        err = 2;
      }
    };
    for (int i = 0; i < pairs / 10 + 100; ++i) pair();  // warm-up: pool segments, first-seen stacks
    for (auto& s : samples) {
      const auto a = Clock::now();
      pair();
      const auto b = Clock::now();
      const uint64_t ns = ns_between(a, b);
      s = ns > overhead ? ns - overhead : 0;
    }
  };
  gpushim_bench::at_depth(native_frames, run);
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (err != 0) return err;
  std::sort(samples.begin(), samples.end());
  *p50 = static_cast<double>(samples[samples.size() / 2]);
  *p99 = static_cast<double>(samples[samples.size() * 99 / 100]);
  return 0;
}
