// Explicit graph construction in the runtime: each call translates its parameters to the driver's
// cuGraph* call (cudaGraphAddKernelNode is in kernel_api.cpp, which knows the registered kernels).
#include <cstring>

#include "runtime.h"

using namespace fakecudart;

namespace {
CUgraph G(cudaGraph_t g) { return reinterpret_cast<CUgraph>(g); }
CUgraphNode* N(cudaGraphNode_t* n) { return reinterpret_cast<CUgraphNode*>(n); }
const CUgraphNode* N(const cudaGraphNode_t* n) { return reinterpret_cast<const CUgraphNode*>(n); }
}  // namespace

cudaError_t CUDARTAPI cudaGraphCreate(cudaGraph_t* pGraph, unsigned int flags) {
  return Call([&] { return Driver().cuGraphCreate(reinterpret_cast<CUgraph*>(pGraph), flags); });
}

cudaError_t CUDARTAPI cudaGraphAddEmptyNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                            const cudaGraphNode_t* pDependencies, size_t numDependencies) {
  return Call([&] { return Driver().cuGraphAddEmptyNode(N(pGraphNode), G(graph), N(pDependencies), numDependencies); });
}

cudaError_t CUDARTAPI cudaGraphAddHostNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                           const cudaGraphNode_t* pDependencies, size_t numDependencies,
                                           const struct cudaHostNodeParams* pNodeParams) {
  if (pNodeParams == nullptr) return Record(cudaErrorInvalidValue);
  CUDA_HOST_NODE_PARAMS p{pNodeParams->fn, pNodeParams->userData};
  return Call([&] { return Driver().cuGraphAddHostNode(N(pGraphNode), G(graph), N(pDependencies), numDependencies, &p); });
}

cudaError_t CUDARTAPI cudaGraphAddMemsetNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                             const cudaGraphNode_t* pDependencies, size_t numDependencies,
                                             const struct cudaMemsetParams* pMemsetParams) {
  if (pMemsetParams == nullptr) return Record(cudaErrorInvalidValue);
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = reinterpret_cast<CUdeviceptr>(pMemsetParams->dst);
  p.pitch = pMemsetParams->pitch;
  p.value = pMemsetParams->value;
  p.elementSize = pMemsetParams->elementSize;
  p.width = pMemsetParams->width;
  p.height = pMemsetParams->height;
  return Call([&] {
    CUcontext ctx = nullptr;
    Driver().cuCtxGetCurrent(&ctx);
    return Driver().cuGraphAddMemsetNode(N(pGraphNode), G(graph), N(pDependencies), numDependencies, &p, ctx);
  });
}

cudaError_t CUDARTAPI cudaGraphAddMemcpyNode1D(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                               const cudaGraphNode_t* pDependencies, size_t numDependencies, void* dst,
                                               const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return Record(cudaErrorInvalidMemcpyDirection);
  // Unified addressing: every pointer is an address either side can name.
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.srcDevice = reinterpret_cast<CUdeviceptr>(src);
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  c.WidthInBytes = count;
  c.Height = 1;
  c.Depth = 1;
  return Call([&] {
    CUcontext ctx = nullptr;
    Driver().cuCtxGetCurrent(&ctx);
    return Driver().cuGraphAddMemcpyNode(N(pGraphNode), G(graph), N(pDependencies), numDependencies, &c, ctx);
  });
}

cudaError_t CUDARTAPI cudaGraphAddMemAllocNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                               const cudaGraphNode_t* pDependencies, size_t numDependencies,
                                               struct cudaMemAllocNodeParams* nodeParams) {
  if (nodeParams == nullptr) return Record(cudaErrorInvalidValue);
  CUDA_MEM_ALLOC_NODE_PARAMS p{};
  p.poolProps.allocType = static_cast<CUmemAllocationType>(nodeParams->poolProps.allocType);
  p.poolProps.handleTypes = static_cast<CUmemAllocationHandleType>(nodeParams->poolProps.handleTypes);
  p.poolProps.location.type = static_cast<CUmemLocationType>(nodeParams->poolProps.location.type);
  p.poolProps.location.id = nodeParams->poolProps.location.id;
  p.accessDescs = reinterpret_cast<const CUmemAccessDesc*>(nodeParams->accessDescs);
  p.accessDescCount = nodeParams->accessDescCount;
  p.bytesize = nodeParams->bytesize;
  cudaError_t e = Call([&] {
    if (Driver().cuGraphAddMemAllocNode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // optional in runtime.h
    return Driver().cuGraphAddMemAllocNode(N(pGraphNode), G(graph), N(pDependencies), numDependencies, &p);
  });
  if (e == cudaSuccess) nodeParams->dptr = reinterpret_cast<void*>(p.dptr);
  return e;
}

cudaError_t CUDARTAPI cudaGraphAddMemFreeNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                              const cudaGraphNode_t* pDependencies, size_t numDependencies, void* dptr) {
  return Call([&] {
    return Driver().cuGraphAddMemFreeNode(N(pGraphNode), G(graph), N(pDependencies), numDependencies,
                                          reinterpret_cast<CUdeviceptr>(dptr));
  });
}

cudaError_t CUDARTAPI cudaGraphClone(cudaGraph_t* pGraphClone, cudaGraph_t originalGraph) {
  return Call([&] { return Driver().cuGraphClone(reinterpret_cast<CUgraph*>(pGraphClone), G(originalGraph)); });
}

cudaError_t CUDARTAPI cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* numNodes) {
  return Call([&] { return Driver().cuGraphGetNodes(G(graph), N(nodes), numNodes); });
}
