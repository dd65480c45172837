// CUDA's own rules for cudaMalloc and cudaFree during stream capture: in global (and thread-local)
// mode they are refused with cudaErrorStreamCaptureUnsupported and invalidate the capture; in
// relaxed mode they work. Once a capture is invalidated, and until it ends, the stream's own
// stream-ordered calls are refused too (cudaErrorStreamCaptureInvalidated), and a refused free
// frees nothing. Prints every answer as JSON, for the test to compare with CUDA's.
#include <string>

#include "support/test_support.h"

namespace {

std::string name(cudaError_t e) { return cudaGetErrorName(e); }

}  // namespace

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* held = nullptr;
  CHECK(cudaMalloc(&held, 1 << 20));
  CHECK(cudaMemset(held, 0x42, 1 << 20));
  std::string out = "{";
  for (const auto& [mode, label] : {std::pair{cudaStreamCaptureModeGlobal, "global"},
                                    std::pair{cudaStreamCaptureModeThreadLocal, "thread_local"},
                                    std::pair{cudaStreamCaptureModeRelaxed, "relaxed"}}) {
    CHECK(cudaStreamBeginCapture(s, mode));
    void* p = nullptr;
    const cudaError_t malloc_err = cudaMalloc(&p, 2 << 20);
    const cudaError_t last_after_malloc = cudaGetLastError();
    cudaGraph_t graph = nullptr;
    const cudaError_t end_after_malloc = cudaStreamEndCapture(s, &graph);
    if (graph) CHECK(cudaGraphDestroy(graph));
    if (malloc_err == cudaSuccess) CHECK(cudaFree(p));
    CHECK(cudaStreamBeginCapture(s, mode));
    const cudaError_t free_err = cudaFree(held);
    (void)cudaGetLastError();
    graph = nullptr;
    const cudaError_t end_after_free = cudaStreamEndCapture(s, &graph);
    if (graph) CHECK(cudaGraphDestroy(graph));
    if (free_err == cudaSuccess) {
      CHECK(cudaMalloc(&held, 1 << 20));
      CHECK(cudaMemset(held, 0x42, 1 << 20));
    }
    // A refused free frees nothing: the block still holds its data.
    unsigned char byte = 0;
    CHECK(cudaMemcpy(&byte, static_cast<char*>(held) + 12345, 1, cudaMemcpyDeviceToHost));
    out += std::string(out.size() > 1 ? ", " : "") + "\"" + label + "\": {\"malloc\": \"" + name(malloc_err) +
           "\", \"last_error\": \"" + name(last_after_malloc) + "\", \"end_after_malloc\": \"" +
           name(end_after_malloc) + "\", \"free\": \"" + name(free_err) + "\", \"end_after_free\": \"" +
           name(end_after_free) + "\", \"intact\": " + (byte == 0x42 ? "true" : "false") + "}";
  }
  // A capture invalidated by an unsafe call (global and thread-local modes), then stream-ordered
  // calls on its stream: a block allocated before the capture, and a new request.
  for (const auto& [mode, label] : {std::pair{cudaStreamCaptureModeGlobal, "global_invalidated"},
                                    std::pair{cudaStreamCaptureModeThreadLocal, "thread_local_invalidated"}}) {
    void* before = nullptr;
    CHECK(cudaMallocAsync(&before, 1 << 20, s));
    CHECK(cudaMemsetAsync(before, 0x37, 1 << 20, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamBeginCapture(s, mode));
    void* unsafe = nullptr;
    const cudaError_t invalidating = cudaMalloc(&unsafe, 4096);
    (void)cudaGetLastError();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK(cudaStreamIsCapturing(s, &status));
    void* p = nullptr;
    const cudaError_t malloc_async_err = cudaMallocAsync(&p, 1 << 20, s);
    (void)cudaGetLastError();
    const cudaError_t free_async_err = cudaFreeAsync(before, s);
    (void)cudaGetLastError();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    (void)cudaGetLastError();
    if (graph) CHECK(cudaGraphDestroy(graph));
    if (malloc_async_err == cudaSuccess) CHECK(cudaFreeAsync(p, s));
    unsigned char byte = 0;
    bool intact = false;
    if (free_async_err != cudaSuccess) {
      CHECK(cudaMemcpy(&byte, static_cast<char*>(before) + 4321, 1, cudaMemcpyDeviceToHost));
      intact = byte == 0x37;
      CHECK(cudaFreeAsync(before, s));
    }
    CHECK(cudaStreamSynchronize(s));
    out += std::string(", \"") + label + "\": {\"invalidating\": \"" + name(invalidating) + "\", \"status\": " +
           std::to_string(static_cast<int>(status)) + ", \"malloc_async\": \"" + name(malloc_async_err) +
           "\", \"free_async\": \"" + name(free_async_err) + "\", \"end\": \"" + name(end) +
           "\", \"intact\": " + (intact ? "true" : "false") + "}";
  }
  CHECK(cudaFree(held));
  CHECK(cudaStreamDestroy(s));
  std::printf("%s}\n", out.c_str());
  return 0;
}
