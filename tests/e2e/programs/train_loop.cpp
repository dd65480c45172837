// A training job in miniature, for traces, replays and plots: model weights loaded once and kept,
// activations allocated and freed every iteration (some stream-ordered), and a planted leak that
// keeps some memory per iteration in leaky_step(). Marks each iteration through
// gpushim_mark_iteration when the shim exports it. An out-of-memory error ends the loop the way it
// ends a training job, but cleanly: the program reports it and frees what it holds.
//
// Usage: e2e_train_loop [iterations] [--leak-mib N] [--hang] [--async] [--kernel-us N]
//   --leak-mib N: leak N MiB per iteration (default 1)
//   --hang: after the last iteration print "ready" and wait to be killed (kill -9 tests).
//   --async: activations are cudaMallocAsync/cudaFreeAsync on the job's stream, as PyTorch's
//     backend:cudaMallocAsync makes them (default: cudaMalloc/cudaFree, as under
//     PYTORCH_NO_CUDA_MEMORY_CACHING=1): the launcher's --torch-alloc choice, measured.
//   --kernel-us N: each layer runs a kernel of N us writing its activation (still running when
//     the activation is freed).
#include <unistd.h>

#include <cstring>
#include <vector>

#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;
bool g_async = false;
unsigned g_kernel_us = 0;

std::vector<void*> load_model() {
  std::vector<void*> weights;
  for (int i = 0; i < 8; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 16 * kMiB));
    weights.push_back(p);
  }
  return weights;
}

// False on out-of-memory (after freeing what it took); any other error ends the program.
bool forward_backward(cudaStream_t stream, int iteration) {
  std::vector<void*> activations;
  bool ok = true;
  for (int layer = 0; layer < 6 && ok; ++layer) {
    void* p = nullptr;
    const size_t bytes = (4 + layer + iteration % 3) * kMiB;
    const cudaError_t e = g_async ? cudaMallocAsync(&p, bytes, stream) : cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) ok = false;
    else CHECK(e);
    if (ok) activations.push_back(p);
    if (ok && g_kernel_us) CHECK(testsupport::delayed_fill(p, layer, bytes, g_kernel_us, stream));
  }
  if (ok) {
    // Where a capped run runs out depends on where freed blocks landed: the scratch buffer may be
    // the allocation refused, and that too ends the loop cleanly.
    void* scratch = nullptr;
    const cudaError_t e = cudaMallocAsync(&scratch, 3 * kMiB, stream);
    if (e == cudaErrorMemoryAllocation) ok = false;
    else CHECK(e);
    if (ok) CHECK(cudaFreeAsync(scratch, stream));
  }
  for (auto it = activations.rbegin(); it != activations.rend(); ++it)
    CHECK(g_async ? cudaFreeAsync(*it, stream) : cudaFree(*it));
  return ok;
}

bool leaky_step(std::vector<void*>* kept, size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) return false;
  CHECK(e);
  kept->push_back(p);  // the planted leak: one block more every iteration
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20;
  size_t leak = kMiB;
  bool hang = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hang") == 0) hang = true;
    else if (std::strcmp(argv[i], "--leak-mib") == 0 && i + 1 < argc) leak = static_cast<size_t>(std::atoi(argv[++i])) * kMiB;
    else if (std::strcmp(argv[i], "--async") == 0) g_async = true;
    else if (std::strcmp(argv[i], "--kernel-us") == 0 && i + 1 < argc) g_kernel_us = static_cast<unsigned>(std::atoi(argv[++i]));
    else iterations = std::atoi(argv[i]);
  }
  using MarkFn = unsigned long long (*)();  // gpushim_mark_iteration, as gpushim.h declares it
  auto mark = reinterpret_cast<MarkFn>(dlsym(RTLD_DEFAULT, "gpushim_mark_iteration"));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));
  std::vector<void*> weights = load_model();
  std::vector<void*> leaked;
  int done = 0, oom_at = -1;
  for (int it = 0; it < iterations; ++it) {
    if (!forward_backward(stream, it) || !leaky_step(&leaked, leak)) {
      oom_at = it;
      break;
    }
    CHECK(cudaStreamSynchronize(stream));
    if (mark) mark();
    ++done;
    usleep(2000);  // iterations take time, so time-based views spread them out
  }
  std::printf("{\"iterations\":%d,\"leaked\":%zu,\"oom_at\":%d,\"marks\":%s}\n", done, leaked.size(), oom_at,
              mark ? "true" : "false");
  std::fflush(stdout);
  if (hang) {
    std::printf("ready\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  for (void* p : weights) CHECK(cudaFree(p));
  if (oom_at >= 0)
    for (void* p : leaked) CHECK(cudaFree(p));  // a job that died of OOM leaves nothing behind
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
