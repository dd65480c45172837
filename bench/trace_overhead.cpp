// The whole cost of a traced allocation, as a program sees it: cudaMalloc + cudaFree pairs in a
// tight loop under libgpushim.so, timed on the calling thread's CPU clock. Run it twice, with and
// without GPUSHIM_TRACE, and compare (docs/benchmarks.md):
//
//   LD_PRELOAD=build/lib/libgpushim.so LD_LIBRARY_PATH=build/fakecuda build/bin/gpushim_trace_overhead
//   GPUSHIM_TRACE=/tmp/t.trace LD_PRELOAD=... build/bin/gpushim_trace_overhead
//
// The program starts one idle thread first. A real CUDA process is multi-threaded anyway (the
// driver starts its own threads; the simulated one does not), and glibc runs a multi-threaded
// process's syscalls, locks and malloc more slowly than a single-threaded one's. Without the idle
// thread the trace's writer thread alone would flip the process to the slow mode and the difference
// would be charged to tracing. --single-threaded measures that case too.
#include <cuda_runtime_api.h>
#include <time.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  int pairs = 200000;
  bool single_threaded = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--single-threaded") == 0) single_threaded = true;
    else pairs = std::atoi(argv[i]);
  }
  if (!single_threaded) std::thread([] { pause(); }).detach();
  const int rounds = 7;
  void* warm = nullptr;
  if (cudaMalloc(&warm, 1 << 20) != cudaSuccess || cudaFree(warm) != cudaSuccess) return 1;
  std::vector<double> per_pair;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t t0 = thread_cpu_ns();
    for (int i = 0; i < pairs; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, static_cast<size_t>(4096) << (i & 7)) != cudaSuccess) return 1;
      if (cudaFree(p) != cudaSuccess) return 1;
    }
    per_pair.push_back(static_cast<double>(thread_cpu_ns() - t0) / pairs);
  }
  std::sort(per_pair.begin(), per_pair.end());
  std::printf("{\"pairs\":%d,\"rounds\":%d,\"single_threaded\":%s,\"median_ns_per_pair\":%.1f,\"min_ns_per_pair\":%.1f}\n",
              pairs, rounds, single_threaded ? "true" : "false", per_pair[rounds / 2], per_pair[0]);
  return 0;
}
