// The C++ twin of python/planted_leak.py: load_model allocates large buffers once (flat), every
// call of leaky_step leaks one MiB and frees a temporary. argv: iterations, then "marks" to call
// gpushim_mark_iteration() (looked up at run time: the program also runs without the shim).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/test_support.h"

namespace {
std::vector<void*> g_weights, g_leaked;
constexpr size_t kMiB = 1 << 20;
}  // namespace

extern "C" __attribute__((noinline)) void load_model() {
  for (int i = 0; i < 4; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 64 * kMiB));
    g_weights.push_back(p);
  }
}

// extern "C" and exported (the program links with -rdynamic) so that GPUSHIM_ITERATION_SITE can
// name it.
extern "C" __attribute__((noinline)) int leaky_step(int step) {
  void* kept = nullptr;
  CHECK(cudaMalloc(&kept, kMiB));
  g_leaked.push_back(kept);  // the bug: kept past the step
  void* scratch = nullptr;
  CHECK(cudaMalloc(&scratch, 8 * kMiB));
  CHECK(cudaFree(scratch));
  return step;
}

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 60;
  const bool marks = argc > 2 && std::strcmp(argv[2], "marks") == 0;
  using MarkFn = unsigned long long (*)();
  const auto mark = reinterpret_cast<MarkFn>(dlsym(RTLD_DEFAULT, "gpushim_mark_iteration"));
  load_model();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    leaky_step(i);
    if (marks && mark != nullptr) mark();
    usleep(4000);
  }
  // The loop's own time: what the report's growth rate is checked against (it depends on the device:
  // a GPU's cudaMalloc and cudaFree take far longer than the simulated device's).
  const double loop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"loop_s\":%.6f}\n", loop_s);
  return 0;
}
