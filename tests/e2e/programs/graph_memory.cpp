// Graph memory, accounted apart from ordinary device memory: an explicit graph memory node
// (cuGraphAddMemAllocNode) and a stream-ordered allocation captured into a graph. Prints the
// shim's device figures at each step for the test (the report shows graph memory on its own).
#include <cuda.h>

#include "support/driver_api.h"
#include "support/test_support.h"

#define DRV(x)                                                                                     \
  do {                                                                                             \
    CUresult r_ = (x);                                                                             \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

int main() {
  const testsupport::Driver& D = testsupport::driver();
  CHECK(cudaFree(nullptr));
  CUgraph graph = nullptr;
  DRV(D.GraphCreate(&graph, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS params = {};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = 0;
  params.bytesize = 6 << 20;
  CUgraphNode node = nullptr;
  DRV(D.GraphAddMemAllocNode(&node, graph, nullptr, 0, &params));
  gpushim_device_stats st = {};
  const bool have = testsupport::shim_stats(0, &st);
  std::printf("{\"node_device_live\":%llu", have ? static_cast<unsigned long long>(st.live_bytes) : 0ull);

  // Captured: stays allocated after the capture (the graph does not free it).
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  void* captured = nullptr;
  CHECK(cudaMallocAsync(&captured, 2 << 20, s));
  cudaGraph_t captured_graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &captured_graph));
  testsupport::shim_stats(0, &st);
  std::printf(",\"captured_device_live\":%llu", static_cast<unsigned long long>(st.live_bytes));

  // The node's memory exists once a launch has run the node (before that, real GPUs refuse to free
  // it: CUDA_ERROR_INVALID_VALUE on an H200 and an H100); then it is the program's to free.
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, nullptr));
  CHECK(cudaStreamSynchronize(nullptr));
  CHECK(cudaGraphExecDestroy(exec));
  DRV(D.MemFreeAsync(params.dptr, nullptr));
  DRV(D.StreamSynchronize(nullptr));
  DRV(D.GraphDestroy(graph));
  std::printf(",\"node_freed\":true}\n");
  return 0;
}
