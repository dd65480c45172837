// A graph capture on one thread must not stop another thread's allocation loop: thread B captures
// on its own stream (thread-local or relaxed mode, where CUDA lets other threads go on) for as long
// as thread A runs cudaMallocAsync / cudaMemsetAsync / cudaFreeAsync on its own stream, each step
// synchronized. Every step must be served; a pool that held each freed block until the capture
// ended ran out of memory after a few steps (a defect hunt's reproducer, 2026-11-28).
//
//   e2e_capture_elsewhere thread_local|relaxed [steps] [MiB per step]
// Prints {"failed_at": -1 or the step, "error": ..., "capture_end": ..., "peak_reserved_bytes": ...}.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "support/test_support.h"

int main(int argc, char** argv) {
  const bool relaxed = argc > 1 && std::strcmp(argv[1], "relaxed") == 0;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 40;
  const size_t bytes = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64) << 20;
  CHECK(cudaFree(nullptr));

  std::atomic<bool> capturing{false}, done{false};
  cudaError_t end_err = cudaSuccess;
  std::thread capturer([&] {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* buf = nullptr;
    CHECK(cudaMalloc(&buf, 1 << 20));
    CHECK(cudaStreamBeginCapture(s, relaxed ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeThreadLocal));
    capturing = true;
    for (int i = 0; !done; ++i) {
      CHECK(cudaMemsetAsync(buf, i & 0xff, 1 << 20, s));
      std::this_thread::yield();
    }
    cudaGraph_t g = nullptr;
    end_err = cudaStreamEndCapture(s, &g);
    if (g) CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(buf));
    CHECK(cudaStreamDestroy(s));
  });
  while (!capturing) std::this_thread::yield();

  cudaStream_t mine;
  CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  int failed_at = -1;
  cudaError_t err = cudaSuccess;
  for (int i = 0; i < steps; ++i) {
    void* p = nullptr;
    err = cudaMallocAsync(&p, bytes, mine);
    if (err != cudaSuccess) {
      failed_at = i;
      break;
    }
    CHECK(cudaMemsetAsync(p, i & 0xff, bytes, mine));
    CHECK(cudaFreeAsync(p, mine));
    CHECK(cudaStreamSynchronize(mine));
  }
  done = true;
  capturer.join();
  CHECK(cudaStreamDestroy(mine));

  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  std::printf("{\"failed_at\": %d, \"error\": \"%s\", \"capture_end\": \"%s\", \"peak_reserved_bytes\": %s}\n",
              failed_at, cudaGetErrorName(err), cudaGetErrorName(end_err),
              shim ? std::to_string(st.peak_reserved_bytes).c_str() : "null");
  return 0;
}
