// CUDA's own rules for cudaMalloc and cudaFree during stream capture: in global (and thread-local)
// mode they are refused with cudaErrorStreamCaptureUnsupported and invalidate the capture; in
// relaxed mode they work. Prints every answer as JSON, for the test to compare with CUDA's.
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
  CHECK(cudaFree(held));
  CHECK(cudaStreamDestroy(s));
  std::printf("%s}\n", out.c_str());
  return 0;
}
