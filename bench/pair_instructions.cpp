// Instructions per 4 KiB allocate + free pair, counted by callgrind: a count does not move with a
// neighbour on the same core, which on the shared machines we measure on moves a pair's
// nanoseconds by a third from one run to the next, so it can tell two versions of the shim apart
// by a few percent (docs/benchmarks.md, "What made the 4 KiB pair slower"). Each loop is its own
// function so that callgrind counts only it (one command line, wrapped here):
//
//   LD_LIBRARY_PATH=build/fakecuda LD_PRELOAD=build/lib/libgpushim.so GPUSHIM_STACK_DEPTH=0
//     GPUSHIM_REPORT=off valgrind --tool=callgrind --toggle-collect='plain_pairs*'
//     build/bin/gpushim_pair_instructions 20000
//
// then divide the total by the pairs it printed (--toggle-collect='stream_ordered_pairs*' for the
// cudaMallocAsync + cudaFreeAsync pair on a non-blocking stream). Each loop runs 1,000 pairs
// before the counted ones, so the count covers the steady state: the pool's segment taken, the
// caches filled.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace {

constexpr size_t kBytes = 4096;
constexpr int kWarmPairs = 1000;

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

// extern "C" and noinline: one name per loop for callgrind's --toggle-collect, whatever inlining.
extern "C" __attribute__((noinline)) bool plain_pairs(int n) {
  for (int i = 0; i < n; ++i) {
    void* p = nullptr;
    if (!ok(cudaMalloc(&p, kBytes), "cudaMalloc") || !ok(cudaFree(p), "cudaFree")) return false;
  }
  return true;
}

extern "C" __attribute__((noinline)) bool stream_ordered_pairs(int n, cudaStream_t s) {
  for (int i = 0; i < n; ++i) {
    void* p = nullptr;
    if (!ok(cudaMallocAsync(&p, kBytes, s), "cudaMallocAsync") || !ok(cudaFreeAsync(p, s), "cudaFreeAsync"))
      return false;
  }
  return true;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (n <= 0) {
    std::fprintf(stderr, "usage: %s [PAIRS]\n", argv[0]);
    return 2;
  }
  cudaStream_t s = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags")) return 1;
  if (!plain_pairs(kWarmPairs) || !stream_ordered_pairs(kWarmPairs, s)) return 1;
  if (!plain_pairs(n) || !stream_ordered_pairs(n, s)) return 1;
  // What callgrind counted covers the warm-up pairs too (the toggle is on the function).
  std::printf("%d pairs per loop counted (%d warm-up + %d)\n", kWarmPairs + n, kWarmPairs, n);
  return ok(cudaStreamDestroy(s), "cudaStreamDestroy") ? 0 : 1;
}
