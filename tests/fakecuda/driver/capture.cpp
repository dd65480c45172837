// Stream capture and the minimal graph objects it produces.
//
// What matters for a memory pool under test is the *legality* rules of capture, which are enforced
// as in CUDA:
//   * a "potentially unsafe" call (synchronization, event query, cuMemAlloc/cuMemFree) made while a
//     conflicting capture is in progress fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
//     invalidates that capture, so cuStreamEndCapture then fails with ..._INVALIDATED;
//   * which captures conflict follows cuThreadExchangeStreamCaptureMode: GLOBAL (default) conflicts
//     with the thread's own non-relaxed capture and with GLOBAL captures of other threads,
//     THREAD_LOCAL only with the thread's own, RELAXED with none;
//   * work on a capturing stream is recorded, not executed. cuMemAllocAsync there returns graph
//     memory that counts against capacity.
// The graph itself is a dummy: it keeps the replayable data operations (copies, memsets, fills,
// host functions) so cuGraphLaunch can redo them, and owns graph memory freed inside it.
#include <algorithm>

#include "driver.h"

namespace fakecuda {
namespace {

thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool ValidMode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

void EndSequence(State& s, const std::shared_ptr<Capture>& cap) {
  for (const auto& st : cap->streams) {
    if (st->capture == cap) st->capture.reset();
  }
  cap->streams.clear();
  s.captures.erase(std::remove(s.captures.begin(), s.captures.end(), cap), s.captures.end());
}

}  // namespace

void NoteCapturedNode(Capture& capture, const Stream* stream) { ++capture.nodes[stream]; }

CUresult CheckUnsafeCall(State& s) {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED || s.captures.empty()) return CUDA_SUCCESS;
  const std::thread::id self = std::this_thread::get_id();
  bool prohibited = false;
  for (const auto& cap : s.captures) {
    const bool own = cap->thread == self && cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool foreign_global = t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && cap->thread != self &&
                                cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || foreign_global) {
      InvalidateCapture(s, *cap);
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

void InvalidateCapture(State& s, Capture& capture) {
  (void)s;
  capture.invalidated = true;
}

CUresult RefuseIfCapturing(State& s, Stream* stream) {
  if (!stream->capture) return CUDA_SUCCESS;
  InvalidateCapture(s, *stream->capture);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult CheckLegacyImplicitDependency(State& s, Context* ctx) {
  bool conflict = false;
  for (const auto& st : ctx->streams) {
    if (st->capture && st->blocking()) {
      InvalidateCapture(s, *st->capture);
      conflict = true;
    }
  }
  return conflict ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

void PublishGraph(State& s, const std::shared_ptr<Graph>& graph) {
  if (graph->handle == 0) graph->handle = MintHandle(s, HandleKind::kGraph);
  s.graphs[reinterpret_cast<const void*>(graph->handle)] = graph;
}

std::shared_ptr<Graph> LiveGraph(State& s, CUgraph h, const char* call) {
  auto it = s.graphs.find(h);
  if (it == s.graphs.end()) BadHandle(s, call, HandleKind::kGraph, reinterpret_cast<std::uintptr_t>(h));
  return it->second;
}

namespace {
std::shared_ptr<GraphExec> LiveGraphExec(State& s, CUgraphExec h, const char* call) {
  auto it = s.graph_execs.find(h);
  if (it == s.graph_execs.end()) BadHandle(s, call, HandleKind::kGraphExec, reinterpret_cast<std::uintptr_t>(h));
  return it->second;
}
}  // namespace

void MaybeReleaseGraph(State& s, const std::shared_ptr<Graph>& graph) {
  if (graph->user_handle_alive || graph->execs > 0) return;
  for (std::uintptr_t base : graph->owned_allocations) {
    ++s.device_free_calls;
    ReleaseRegion(s, base);
  }
  graph->owned_allocations.clear();
  // Frees of another graph's memory this graph was to make at a launch that never came: that
  // memory stays the program's (a launched graph released it then, and the ids no longer match).
  for (const auto& [base, buffer_id] : graph->deferred_frees) {
    auto it = s.regions.find(base);
    if (it != s.regions.end() && it->second.buffer_id == buffer_id) it->second.free_node_pending = false;
  }
  graph->deferred_frees.clear();
  // Graph memory no launch ever allocated never existed for the program (it cannot free it).
  for (std::uintptr_t base : graph->allocations) {
    auto it = s.regions.find(base);
    if (it != s.regions.end() && it->second.kind == RegionKind::kGraph && it->second.graph_unlaunched) {
      ++s.device_free_calls;
      ReleaseRegion(s, base);
    }
  }
  graph->allocations.clear();
  graph->nodes.clear();
  graph->touches.clear();
}

// `capture` is taken by value: callers pass members (Stream::capture) that this resets.
void AbandonCapture(State& s, std::shared_ptr<Capture> capture) {
  EndSequence(s, capture);
  // A capture that produced no graph never frees anything: the captured frees are void.
  for (const auto& [base, buffer_id] : capture->graph->deferred_frees) {
    auto it = s.regions.find(base);
    if (it != s.regions.end() && it->second.buffer_id == buffer_id) it->second.free_node_pending = false;
  }
  capture->graph->deferred_frees.clear();
  capture->graph->user_handle_alive = false;
  MaybeReleaseGraph(s, capture->graph);
}

void DropCapturesOfContext(State& s, Context* ctx) {
  std::vector<std::shared_ptr<Capture>> doomed;
  for (const auto& cap : s.captures) {
    if (cap->origin->ctx == ctx) doomed.push_back(cap);
  }
  for (const auto& cap : doomed) AbandonCapture(s, cap);
}

}  // namespace fakecuda

using namespace fakecuda;

namespace {

CUresult BeginCapture(CUstream hStream, CUstreamCaptureMode mode, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamBeginCapture"); r != CUDA_SUCCESS) return r;
  if (!ValidMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  if (st->kind == StreamKind::kLegacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (st->capture) return CUDA_ERROR_ILLEGAL_STATE;
  auto cap = std::make_shared<Capture>();
  cap->id = NextId(s);
  cap->mode = mode;
  cap->thread = std::this_thread::get_id();
  cap->origin = st;
  cap->graph = std::make_shared<Graph>();
  cap->graph->ctx = st->ctx;
  // The handle exists from now on (cuStreamGetCaptureInfo reports it); it goes live at the end.
  cap->graph->handle = MintHandle(s, HandleKind::kGraph);
  cap->streams.push_back(SharedStream(s, st));
  st->capture = cap;
  s.captures.push_back(cap);
  return CUDA_SUCCESS;
}

CUresult EndCapture(CUstream hStream, CUgraph* phGraph, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamEndCapture"); r != CUDA_SUCCESS) return r;
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!st->capture) return CUDA_ERROR_ILLEGAL_STATE;
  const std::shared_ptr<Capture> cap = st->capture;
  if (cap->origin != st) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->thread != std::this_thread::get_id()) {
    // Refused, and the capture is over all the same: an H200 left the stream not capturing, the
    // capturing thread's next stream-ordered call on another stream went through and its own end
    // answered CUDA_ERROR_ILLEGAL_STATE (2026-11-27, tests/gpu/capture_queries_h200.jsonl).
    AbandonCapture(s, cap);
    *phGraph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  if (cap->invalidated) {
    AbandonCapture(s, cap);
    *phGraph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  // "the capture graph contains a fork that was not joined to the primary stream": a stream that
  // joined recorded nodes the origin does not depend on. The capture is over all the same, as
  // after the other refusals here (assumed; an H200 ended it for a wrong thread).
  const std::map<const Stream*, std::uint64_t>& joined = cap->depends[st];
  for (const auto& [stream, nodes] : cap->nodes) {
    if (stream == st) continue;
    auto it = joined.find(stream);
    if (nodes > (it == joined.end() ? 0 : it->second)) {
      AbandonCapture(s, cap);
      *phGraph = nullptr;
      return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    }
  }
  EndSequence(s, cap);
  PublishGraph(s, cap->graph);
  *phGraph = reinterpret_cast<CUgraph>(cap->graph->handle);
  return CUDA_SUCCESS;
}

CUresult CaptureStatus(Stream* st, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (st->kind == StreamKind::kLegacy) {
    // Asking about the legacy stream while a blocking stream captures is itself an implicit
    // dependency on the capture.
    for (const auto& other : st->ctx->streams) {
      if (other->capture && other->blocking()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  }
  if (!st->capture) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
  } else {
    *status = st->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  }
  return CUDA_SUCCESS;
}

CUresult IsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamIsCapturing"); r != CUDA_SUCCESS) return r;
  return CaptureStatus(st, captureStatus);
}

// The fake records no graph nodes, so the dependency set is always empty.
CUresult GetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                        const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamGetCaptureInfo"); r != CUDA_SUCCESS) return r;
  if (CUresult r = CaptureStatus(st, status); r != CUDA_SUCCESS) return r;
  if (id != nullptr && st->capture) *id = st->capture->id;
  if (graph != nullptr) *graph = st->capture ? reinterpret_cast<CUgraph>(st->capture->graph->handle) : nullptr;
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (num_deps != nullptr) *num_deps = 0;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) {
  return BeginCapture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream) {
  return BeginCapture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}
CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return BeginCapture(hStream, mode, false);
}
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return BeginCapture(hStream, mode, true);
}
CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) { return EndCapture(hStream, phGraph, false); }
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return EndCapture(hStream, phGraph, true);
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return IsCapturing(hStream, captureStatus, false);
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return IsCapturing(hStream, captureStatus, true);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                           cuuint64_t* id_out, CUgraph* graph_out,
                                           const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  return GetCaptureInfo(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                        numDependencies_out, false);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  return GetCaptureInfo(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                        numDependencies_out, true);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                           cuuint64_t* id_out, CUgraph* graph_out,
                                           const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out,
                                           size_t* numDependencies_out) {
  return GetCaptureInfo(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out, false);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out,
                                                const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
  return GetCaptureInfo(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out, true);
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr || !ValidMode(*mode)) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Graphs (minimal)
// ---------------------------------------------------------------------------------------------

CUresult CUDAAPI cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto g = std::make_shared<Graph>();
  Context* ctx = nullptr;
  if (CurrentContext(s, &ctx) == CUDA_SUCCESS) g->ctx = ctx;
  PublishGraph(s, g);
  *phGraph = reinterpret_cast<CUgraph>(g->handle);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<Graph> g = LiveGraph(s, hGraph, "cuGraphDestroy");
  s.graphs.erase(hGraph);
  BuryHandle(s, HandleKind::kGraph, g->handle, "cuGraphDestroy");
  g->user_handle_alive = false;
  MaybeReleaseGraph(s, g);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<Graph> g = LiveGraph(s, hGraph, "cuGraphInstantiateWithFlags");
  if (phGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // "If hGraph contains any allocation or free nodes, there can be at most one executable graph in
  // existence for that graph at a time. An attempt to instantiate a second executable graph before
  // destroying the first with cuGraphExecDestroy will result in an error" (the code is assumed).
  if ((!g->allocations.empty() || !g->deferred_frees.empty()) && g->execs > 0) return CUDA_ERROR_INVALID_VALUE;
  auto exec = std::make_shared<GraphExec>();
  exec->graph = g;
  exec->flags = flags;
  exec->ctx = g->ctx;
  ++exec->graph->execs;
  exec->handle = MintHandle(s, HandleKind::kGraphExec);
  s.graph_execs[reinterpret_cast<const void*>(exec->handle)] = exec;
  *phGraphExec = reinterpret_cast<CUgraphExec>(exec->handle);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  std::shared_ptr<Graph> g = LiveGraphExec(s, hGraphExec, "cuGraphExecDestroy")->graph;
  s.graph_execs.erase(hGraphExec);
  BuryHandle(s, HandleKind::kGraphExec, reinterpret_cast<std::uintptr_t>(hGraphExec), "cuGraphExecDestroy");
  --g->execs;
  MaybeReleaseGraph(s, g);
  return CUDA_SUCCESS;
}

namespace {
CUresult GraphLaunch(CUgraphExec hGraphExec, CUstream hStream, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuGraphLaunch"); r != CUDA_SUCCESS) return r;
  const std::shared_ptr<GraphExec> exec = LiveGraphExec(s, hGraphExec, "cuGraphLaunch");
  const std::shared_ptr<Graph> g = exec->graph;
  // Its graph memory exists from this launch on (the fake reserved it earlier, and kept the
  // addresses of what the program freed since the last launch: Region::graph).
  if (!st->capture) {
    // "If any allocations created by hGraphExec remain unfreed (from a previous launch) and
    // hGraphExec was not instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, the
    // launch will fail with CUDA_ERROR_INVALID_VALUE"; with it, they are freed first.
    const bool auto_free = (exec->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
    for (std::uintptr_t base : g->allocations) {
      auto r = s.regions.find(base);
      if (r == s.regions.end() || r->second.kind != RegionKind::kGraph || r->second.graph_unlaunched ||
          std::find(g->owned_allocations.begin(), g->owned_allocations.end(), base) != g->owned_allocations.end())
        continue;  // made by the next launch, or freed inside the graph
      if (!auto_free) return CUDA_ERROR_INVALID_VALUE;
      // Freed as this launch starts, behind the previous one (launches of one executable graph
      // are ordered); made again by it at once.
      ReleaseFreedRegion(s, base);
    }
    for (std::uintptr_t base : g->allocations) {
      auto r = s.regions.find(base);
      if (r == s.regions.end() || r->second.kind != RegionKind::kGraph) continue;
      r->second.graph_unlaunched = false;
      // Made again at the same address: another allocation (CU_POINTER_ATTRIBUTE_BUFFER_ID).
      if (r->second.graph_parked) r->second.buffer_id = NextId(s), r->second.graph_parked = false;
    }
  }
  // Copy the nodes: the graph may be destroyed while the launch is still queued.
  std::vector<std::function<void()>> nodes = g->nodes;
  SubmitOptions opts;
  opts.replayable = true;
  opts.touches = g->touches;
  return Submit(s, st, [nodes = std::move(nodes)] {
    for (const auto& node : nodes) node();
  }, std::move(opts));
}
}  // namespace

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { return GraphLaunch(hGraphExec, hStream, false); }
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return GraphLaunch(hGraphExec, hStream, true);
}

// An explicit graph memory node. Like a cuMemAllocAsync captured into a graph, the fake reserves
// the memory at once (CUDA may back it at any time before the launch) and charges the device; the
// address is valid from now on. Not freed inside the graph, it stays allocated (also after the
// graph is destroyed) until the program frees it with cuMemFreeAsync or cuMemFree.
CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                        size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  (void)dependencies, (void)numDependencies;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  std::shared_ptr<Graph> g = LiveGraph(s, hGraph, "cuGraphAddMemAllocNode");
  if (phGraphNode == nullptr || nodeParams == nullptr || nodeParams->bytesize == 0 ||
      nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      nodeParams->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Device* d = nullptr;
  if (GetDevice(s, nodeParams->poolProps.location.id, &d) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  if (CountAllocCallAndCheckFailure(s)) return CUDA_ERROR_OUT_OF_MEMORY;
  Context* owner = ctx->device == d->ordinal ? ctx : &d->primary;
  std::uintptr_t base = 0;
  if (CUresult r = AllocateArenaRegion(s, owner, nodeParams->bytesize, RegionKind::kGraph, nullptr, &base);
      r != CUDA_SUCCESS) {
    return r;
  }
  nodeParams->dptr = base;
  s.regions[base].graph_unlaunched = true;
  s.regions[base].graph = g;
  g->allocations.push_back(base);
  *phGraphNode = AddGraphNodeHandle(s, g.get());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* d = nullptr;
  return GetDevice(s, device, &d);
}
