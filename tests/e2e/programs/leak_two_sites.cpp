// Leaks from two distinct functions; the report must name both, with exact bytes and counts.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "support/test_support.h"

__attribute__((noinline)) void leak_from_alpha() {
  for (int i = 0; i < 3; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 1 << 20));  // 3 x 1 MiB, never freed
  }
}

__attribute__((noinline)) void leak_from_beta() {
  for (int i = 0; i < 2; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 4 << 20));  // 2 x 4 MiB, never freed
  }
}

__attribute__((noinline)) void temporary_work() {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 64 << 20));  // freed: raises the peak but is not live at exit
  CHECK(cudaFree(p));
}

int main() {
  leak_from_alpha();
  temporary_work();
  leak_from_beta();
  std::printf("done\n");
  return 0;
}
