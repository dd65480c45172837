// The demo job: the shape of a training loop, on any CUDA device. It loads "weights" once,
// allocates activations every step and frees them, runs work on a side stream with the
// stream-ordered API, and — the bug the report should find — keeps one small buffer per step
// alive forever (like a loss kept with its graph).
#include <cstdio>
#include <vector>

#include "support/test_support.h"

namespace {

__attribute__((noinline)) std::vector<void*> load_model(int layers) {
  std::vector<void*> weights;
  for (int i = 0; i < layers; ++i) {
    void* w = nullptr;
    CHECK(cudaMalloc(&w, (16u << 20) + i * 4096));
    CHECK(cudaMemset(w, 0, 1 << 20));
    weights.push_back(w);
  }
  return weights;
}

__attribute__((noinline)) void forward_backward(int step, cudaStream_t side, std::vector<void*>* history) {
  std::vector<void*> activations;
  for (int i = 0; i < 6; ++i) {
    void* a = nullptr;
    CHECK(cudaMalloc(&a, (4u << 20) * (1 + (i + step) % 3)));
    activations.push_back(a);
  }
  void* grad = nullptr;
  CHECK(cudaMallocAsync(&grad, 8u << 20, side));
  CHECK(cudaMemsetAsync(grad, 0, 8u << 20, side));
  CHECK(cudaFreeAsync(grad, side));
  void* loss = nullptr;
  CHECK(cudaMalloc(&loss, 256 << 10));  // kept "for logging": never freed
  history->push_back(loss);
  for (void* a : activations) CHECK(cudaFree(a));
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 40;
  cudaStream_t side;
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::vector<void*> weights = load_model(8);
  std::vector<void*> history;
  for (int step = 0; step < steps; ++step) forward_backward(step, side, &history);
  CHECK(cudaStreamSynchronize(side));
  CHECK(cudaStreamDestroy(side));
  std::printf("trained %d steps; %zu loss buffers kept\n", steps, history.size());
  return 0;
}
