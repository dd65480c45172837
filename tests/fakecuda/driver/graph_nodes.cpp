// Explicit graph construction: cuGraphAdd{Empty,Host,Memset,Memcpy,Kernel,MemFree}Node, cuGraphClone,
// cuGraphGetNodes (cuGraphCreate and cuGraphAddMemAllocNode are in capture.cpp).
//
// A node may only depend on nodes already in its graph, so the order nodes are added in is a valid
// execution order: the fake appends each node's operation to Graph::nodes, which cuGraphLaunch
// replays in order on its stream. Memory nodes follow the fake's model of captured graph memory:
// an allocation node reserves its memory when it is added and the graph owns it until the graph is
// destroyed; a free node ends its use inside the graph.
#include <algorithm>
#include <cstring>

#include "driver.h"

namespace fakecuda {
namespace {

// A node may use graph memory its graph allocates (the launch makes it before the node runs).
const Access kGraphNode{"a graph node", 0, /*graph_node=*/true};

CUresult LookupGraph(State& s, CUgraph h, std::shared_ptr<Graph>* out, const char* call) {
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  *out = LiveGraph(s, h, call);
  return CUDA_SUCCESS;
}

CUresult CheckDependencies(const Graph* g, const CUgraphNode* deps, size_t n) {
  if (n > 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::vector<CUgraphNode>& mine = g->node_handles;
  for (size_t i = 0; i < n; ++i) {
    if (std::find(mine.begin(), mine.end(), deps[i]) == mine.end()) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// The common shape: validate, build the operation (may fail), append it, hand out a handle.
template <typename Build>
CUresult AddNode(const char* call, CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* deps, size_t n,
                 Build&& build) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::shared_ptr<Graph> g;
  if (CUresult r = LookupGraph(s, hGraph, &g, call); r != CUDA_SUCCESS) return r;
  if (phGraphNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDependencies(g.get(), deps, n); r != CUDA_SUCCESS) return r;
  std::function<void()> op;
  if (CUresult r = build(s, &op); r != CUDA_SUCCESS) return r;
  if (op) g->nodes.push_back(std::move(op));
  *phGraphNode = AddGraphNodeHandle(s, g.get());
  return CUDA_SUCCESS;
}

}  // namespace

CUgraphNode AddGraphNodeHandle(State& s, Graph* graph) {
  auto h = reinterpret_cast<CUgraphNode>(NextId(s));
  graph->node_handles.push_back(h);
  return h;
}

}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                     size_t numDependencies) {
  return AddNode("cuGraphAddEmptyNode", phGraphNode, hGraph, dependencies, numDependencies,
                 [](State&, std::function<void()>*) { return CUDA_SUCCESS; });
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                    size_t numDependencies, const CUDA_HOST_NODE_PARAMS* nodeParams) {
  if (nodeParams == nullptr || nodeParams->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUhostFn fn = nodeParams->fn;
  void* user = nodeParams->userData;
  return AddNode("cuGraphAddHostNode", phGraphNode, hGraph, dependencies, numDependencies, [&](State&, std::function<void()>* op) {
    *op = [fn, user] {
      HostFunctionScope scope("cuGraphAddHostNode");
      fn(user);
    };
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                      size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx) {
  (void)ctx;
  if (p == nullptr || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) || p->width == 0 ||
      p->height == 0 || (p->height > 1 && p->pitch < p->width * p->elementSize) || p->dst % p->elementSize != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const CUDA_MEMSET_NODE_PARAMS params = *p;
  return AddNode("cuGraphAddMemsetNode", phGraphNode, hGraph, dependencies, numDependencies, [&](State& s, std::function<void()>* op) {
    const std::size_t row = params.width * params.elementSize;
    const std::size_t span = params.height > 1 ? params.pitch * (params.height - 1) + row : row;
    if (CUresult r = CheckDeviceRange(s, params.dst, span, kGraphNode); r != CUDA_SUCCESS) return r;
    *op = DeviceWork([params, row] {
      for (std::size_t y = 0; y < params.height; ++y) {
        auto* line = reinterpret_cast<unsigned char*>(params.dst + y * (params.height > 1 ? params.pitch : row));
        for (std::size_t x = 0; x < params.width; ++x) {
          std::memcpy(line + x * params.elementSize, &params.value, params.elementSize);  // little-endian
        }
      }
    });
    return CUDA_SUCCESS;
  });
}

// Linear copies only (what cudaGraphAddMemcpyNode1D builds): one row, one slice, no arrays.
CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                      size_t numDependencies, const CUDA_MEMCPY3D* copyParams, CUcontext ctx) {
  (void)ctx;
  if (copyParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_MEMCPY3D c = *copyParams;
  auto address = [](CUmemorytype type, const void* host, CUdeviceptr dev) {
    return type == CU_MEMORYTYPE_HOST ? reinterpret_cast<std::uintptr_t>(host) : static_cast<std::uintptr_t>(dev);
  };
  if (c.srcMemoryType == CU_MEMORYTYPE_ARRAY || c.dstMemoryType == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;
  if (c.Height > 1 || c.Depth > 1 || c.srcXInBytes || c.srcY || c.srcZ || c.dstXInBytes || c.dstY || c.dstZ) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const std::uintptr_t src = address(c.srcMemoryType, c.srcHost, c.srcDevice);
  const std::uintptr_t dst = address(c.dstMemoryType, c.dstHost, c.dstDevice);
  const std::size_t n = c.WidthInBytes;
  if (src == 0 || dst == 0 || n == 0) return CUDA_ERROR_INVALID_VALUE;
  return AddNode("cuGraphAddMemcpyNode", phGraphNode, hGraph, dependencies, numDependencies, [&](State& s, std::function<void()>* op) {
    if (CUresult r = CheckAnyRange(s, src, n, kGraphNode); r != CUDA_SUCCESS) return r;
    if (CUresult r = CheckAnyRange(s, dst, n, kGraphNode); r != CUDA_SUCCESS) return r;
    *op = DeviceWork([src, dst, n] {
      PopulateForWrite(dst, n);
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    });
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                         size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (nodeParams->func == nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // CUkernel (library) kernels
  const CUDA_KERNEL_NODE_PARAMS p = *nodeParams;
  return AddNode("cuGraphAddKernelNode_v2", phGraphNode, hGraph, dependencies, numDependencies, [&](State& s, std::function<void()>* op) {
    const unsigned grid[3] = {p.gridDimX, p.gridDimY, p.gridDimZ}, block[3] = {p.blockDimX, p.blockDimY, p.blockDimZ};
    return PrepareKernelOp(s, p.func, grid, block, p.sharedMemBytes, p.kernelParams, p.extra, op);
  });
}

CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                       size_t numDependencies, CUdeviceptr dptr) {
  return AddNode("cuGraphAddMemFreeNode", phGraphNode, hGraph, dependencies, numDependencies, [&](State& s, std::function<void()>*) {
    // Only graph memory can be freed by a graph, and only at its base address.
    auto it = s.regions.find(dptr);
    if (it == s.regions.end() || it->second.kind != RegionKind::kGraph) return CUDA_ERROR_INVALID_VALUE;
    // Freed inside the graph: the graph owns the memory and releases it when it is destroyed.
    Graph& g = *s.graphs.at(hGraph);
    if (std::find(g.owned_allocations.begin(), g.owned_allocations.end(), dptr) != g.owned_allocations.end()) {
      return CUDA_ERROR_INVALID_VALUE;  // freed twice
    }
    g.owned_allocations.push_back(dptr);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphClone(CUgraph* phGraphClone, CUgraph originalGraph) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::shared_ptr<Graph> original;
  if (CUresult r = LookupGraph(s, originalGraph, &original, "cuGraphClone"); r != CUDA_SUCCESS) return r;
  if (phGraphClone == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Graph memory belongs to one graph in the fake's model; a clone would share its addresses.
  if (!original->owned_allocations.empty()) return CUDA_ERROR_NOT_SUPPORTED;
  auto g = std::make_shared<Graph>();
  g->nodes = original->nodes;
  g->touches = original->touches;
  g->ctx = original->ctx;
  PublishGraph(s, g);
  for (std::size_t i = 0; i < original->node_handles.size(); ++i) AddGraphNodeHandle(s, g.get());
  *phGraphClone = reinterpret_cast<CUgraph>(g->handle);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::shared_ptr<Graph> g;
  if (CUresult r = LookupGraph(s, hGraph, &g, "cuGraphGetNodes"); r != CUDA_SUCCESS) return r;
  if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::vector<CUgraphNode>& mine = g->node_handles;
  if (nodes == nullptr) {
    *numNodes = mine.size();
    return CUDA_SUCCESS;
  }
  const std::size_t n = std::min(*numNodes, mine.size());
  std::copy_n(mine.begin(), n, nodes);
  for (std::size_t i = n; i < *numNodes; ++i) nodes[i] = nullptr;
  *numNodes = n;
  return CUDA_SUCCESS;
}
