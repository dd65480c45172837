// Streams, events, stream capture and graphs. cudaStream_t, cudaEvent_t, cudaGraph_t and
// cudaGraphExec_t are the driver's handle types, so handles pass through unchanged.
#include <memory>

#include "runtime.h"

using namespace fakecudart;

namespace {
// Picks the legacy or per-thread-default-stream variant of a driver function.
template <typename F>
F Pick(bool ptsz, F legacy, F per_thread) {
  return ptsz ? per_thread : legacy;
}

// Like Call(), but cudaErrorNotReady is a status, not an error: CUDA does not make it the thread's
// last error (cudaStreamQuery / cudaEventQuery).
template <typename F>
cudaError_t Query(F&& driver_call) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Record(e);
  const cudaError_t e = Translate(driver_call());
  return e == cudaErrorNotReady ? e : Record(e);
}
}  // namespace

// ---- streams ----

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* pStream) {
  return Call([&] { return Driver().cuStreamCreate(pStream, CU_STREAM_DEFAULT); });
}
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  // cudaStreamNonBlocking == CU_STREAM_NON_BLOCKING.
  return Call([&] { return Driver().cuStreamCreate(pStream, flags); });
}
cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  return Call([&] { return Driver().cuStreamCreateWithPriority(pStream, flags, priority); });
}
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  return Call([&] { return Driver().cuStreamDestroy_v2(stream); });
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  return Call([&] { return Driver().cuStreamSynchronize(stream); });
}
cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  return Call([&] { return Driver().cuStreamSynchronize_ptsz(stream); });
}
cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  return Query([&] { return Driver().cuStreamQuery(stream); });
}
cudaError_t CUDARTAPI cudaStreamQuery_ptsz(cudaStream_t stream) {
  return Query([&] { return Driver().cuStreamQuery_ptsz(stream); });
}
cudaError_t CUDARTAPI cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  return Call([&] { return Driver().cuStreamGetFlags(hStream, flags); });
}
cudaError_t CUDARTAPI cudaStreamGetFlags_ptsz(cudaStream_t hStream, unsigned int* flags) {
  return Call([&] { return Driver().cuStreamGetFlags_ptsz(hStream, flags); });
}
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return Call([&] { return Driver().cuStreamWaitEvent(stream, event, flags); });
}
cudaError_t CUDARTAPI cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return Call([&] { return Driver().cuStreamWaitEvent_ptsz(stream, event, flags); });
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  return Call([&] { return Driver().cuLaunchHostFunc(stream, fn, userData); });
}
cudaError_t CUDARTAPI cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  return Call([&] { return Driver().cuLaunchHostFunc_ptsz(stream, fn, userData); });
}

// ---- stream capture ----

namespace {
cudaError_t BeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode, bool ptsz) {
  const DriverApi& d = Driver();
  return Call([&] {
    return Pick(ptsz, d.cuStreamBeginCapture_v2, d.cuStreamBeginCapture_v2_ptsz)(
        stream, static_cast<CUstreamCaptureMode>(mode));
  });
}
cudaError_t EndCapture(cudaStream_t stream, cudaGraph_t* pGraph, bool ptsz) {
  const DriverApi& d = Driver();
  return Call([&] { return Pick(ptsz, d.cuStreamEndCapture, d.cuStreamEndCapture_ptsz)(stream, pGraph); });
}
cudaError_t IsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status, bool ptsz) {
  const DriverApi& d = Driver();
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cudaError_t e = Call([&] { return Pick(ptsz, d.cuStreamIsCapturing, d.cuStreamIsCapturing_ptsz)(stream, &st); });
  if (e == cudaSuccess && status != nullptr) *status = static_cast<cudaStreamCaptureStatus>(st);
  return e;
}
cudaError_t GetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id,
                           cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                           size_t* num_deps, bool ptsz) {
  const DriverApi& d = Driver();
  if (status == nullptr) return Record(cudaErrorInvalidValue);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture_id = 0;
  cudaError_t e = Call([&] {
    return Pick(ptsz, d.cuStreamGetCaptureInfo_v3, d.cuStreamGetCaptureInfo_v3_ptsz)(
        stream, &st, &capture_id, graph, deps, reinterpret_cast<const CUgraphEdgeData**>(edges), num_deps);
  });
  if (e == cudaSuccess) {
    *status = static_cast<cudaStreamCaptureStatus>(st);
    if (id != nullptr) *id = capture_id;
  }
  return e;
}
}  // namespace

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  return BeginCapture(stream, mode, false);
}
cudaError_t CUDARTAPI cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  return BeginCapture(stream, mode, true);
}
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  return EndCapture(stream, pGraph, false);
}
cudaError_t CUDARTAPI cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph) {
  return EndCapture(stream, pGraph, true);
}
cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  return IsCapturing(stream, pCaptureStatus, false);
}
cudaError_t CUDARTAPI cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  return IsCapturing(stream, pCaptureStatus, true);
}
cudaError_t CUDARTAPI cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus* captureStatus_out,
                                               unsigned long long* id_out, cudaGraph_t* graph_out,
                                               const cudaGraphNode_t** dependencies_out,
                                               const cudaGraphEdgeData** edgeData_out, size_t* numDependencies_out) {
  return GetCaptureInfo(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out, false);
}
cudaError_t CUDARTAPI cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                                    enum cudaStreamCaptureStatus* captureStatus_out,
                                                    unsigned long long* id_out, cudaGraph_t* graph_out,
                                                    const cudaGraphNode_t** dependencies_out,
                                                    const cudaGraphEdgeData** edgeData_out,
                                                    size_t* numDependencies_out) {
  return GetCaptureInfo(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out, true);
}
cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  return Call([&] { return Driver().cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)); });
}

// ---- graphs (minimal) ----

cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  return Call([&] { return Driver().cuGraphInstantiateWithFlags(pGraphExec, graph, flags); });
}
cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                                    unsigned long long flags) {
  return Call([&] { return Driver().cuGraphInstantiateWithFlags(pGraphExec, graph, flags); });
}
cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  return Call([&] { return Driver().cuGraphLaunch(graphExec, stream); });
}
cudaError_t CUDARTAPI cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
  return Call([&] { return Driver().cuGraphLaunch_ptsz(graphExec, stream); });
}
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  return Call([&] { return Driver().cuGraphDestroy(graph); });
}
cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  return Call([&] { return Driver().cuGraphExecDestroy(graphExec); });
}

// ---- events ----

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  return Call([&] { return Driver().cuEventCreate(event, CU_EVENT_DEFAULT); });
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  // cudaEventBlockingSync / DisableTiming / Interprocess have the CU_EVENT_* values.
  return Call([&] { return Driver().cuEventCreate(event, flags); });
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return Call([&] { return Driver().cuEventRecordWithFlags(event, stream, 0); });
}
cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  return Call([&] { return Driver().cuEventRecordWithFlags_ptsz(event, stream, 0); });
}
cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  return Call([&] { return Driver().cuEventRecordWithFlags(event, stream, flags); });
}
cudaError_t CUDARTAPI cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  return Call([&] { return Driver().cuEventRecordWithFlags_ptsz(event, stream, flags); });
}
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  return Query([&] { return Driver().cuEventQuery(event); });
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  return Call([&] { return Driver().cuEventSynchronize(event); });
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  return Call([&] { return Driver().cuEventDestroy_v2(event); });
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return Call([&] { return Driver().cuEventElapsedTime_v2(ms, start, end); });
}

// ---- stream callbacks ----
namespace {
struct RuntimeCallback {
  cudaStreamCallback_t fn;
  void* user;
};
void CallRuntimeCallback(CUstream stream, CUresult status, void* data) {
  std::unique_ptr<RuntimeCallback> cb(static_cast<RuntimeCallback*>(data));
  cb->fn(reinterpret_cast<cudaStream_t>(stream), TranslateCode(status), cb->user);
}
cudaError_t AddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void* userData, unsigned int flags,
                        bool ptsz) {
  if (callback == nullptr || flags != 0) return Record(cudaErrorInvalidValue);
  auto cb = std::make_unique<RuntimeCallback>(RuntimeCallback{callback, userData});
  const cudaError_t e = Call([&] {
    auto add = ptsz ? Driver().cuStreamAddCallback_ptsz : Driver().cuStreamAddCallback;  // driver loaded by now
    return add(stream, CallRuntimeCallback, cb.get(), 0);
  });
  if (e == cudaSuccess) cb.release();  // the callback owns it now
  return e;
}
}  // namespace

cudaError_t CUDARTAPI cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void* userData,
                                            unsigned int flags) {
  return AddCallback(stream, callback, userData, flags, false);
}

cudaError_t CUDARTAPI cudaStreamAddCallback_ptsz(cudaStream_t stream, cudaStreamCallback_t callback, void* userData,
                                                 unsigned int flags) {
  return AddCallback(stream, callback, userData, flags, true);
}
