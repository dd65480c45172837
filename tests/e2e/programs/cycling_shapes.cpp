// The C++ twin of python/cycling_shapes.py: a training loop whose sequence length cycles through
// eight values, with as many temporaries as the length asks for, that keeps a slice of every step's
// hidden state (the leak). Allocations go through a function named like the internals of a static
// CUDA runtime (nvcc's default build links one into the program), which the printed stacks must
// put below the user's own line. argv: steps.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "support/test_support.h"

namespace {
std::vector<void*> g_weights, g_kept;
constexpr size_t kKiB = 1 << 10;
constexpr int kShapes[8] = {64, 96, 128, 160, 192, 224, 256, 288};
}  // namespace

// What a static runtime's internal entry looks like in a stack (a hashed name, in the program).
extern "C" __attribute__((noinline)) cudaError_t libcudart_static_5382377d2d6e3a1f1b1ac3f1a6e2b5f4(void** p,
                                                                                                  size_t n) {
  const cudaError_t e = cudaMalloc(p, n);
  asm volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
  return e;
}

// The allocating call on the user's own line.
#define DEVICE_ALLOC(var, n) \
  void* var = nullptr;       \
  CHECK(libcudart_static_5382377d2d6e3a1f1b1ac3f1a6e2b5f4(&var, (n)))

extern "C" __attribute__((noinline)) void load_model() {
  for (int i = 0; i < 4; ++i) {
    DEVICE_ALLOC(weights, 16 << 20);
    g_weights.push_back(weights);
  }
}

extern "C" __attribute__((noinline)) void train_step(int seq) {
  DEVICE_ALLOC(hidden, seq * 32 * kKiB);
  for (int i = 0; i < seq / 32; ++i) {  // temporaries: their number depends on the shape
    DEVICE_ALLOC(t, seq * 8 * kKiB);
    CHECK(cudaFree(t));
  }
  DEVICE_ALLOC(logits, seq * 16 * kKiB);
  DEVICE_ALLOC(kept, seq * 8 * kKiB);  // @leak: a slice of the hidden state, kept past the step
  g_kept.push_back(kept);
  CHECK(cudaFree(logits));
  CHECK(cudaFree(hidden));
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 40;
  load_model();
  for (int s = 0; s < steps; ++s) train_step(kShapes[s % 8]);
  std::printf("done\n");
  return 0;
}
