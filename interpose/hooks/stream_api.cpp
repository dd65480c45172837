// Stream lifetimes and captures: forwarded untouched, and told to the core first, because a real
// driver crashes on a destroyed stream (cuda/stream_registry.h states the rule these calls keep).
// Both APIs arrive here: libcudart and every static copy of it reach these through
// cuGetProcAddress, so cudaStreamCreate*, cudaStreamDestroy and cudaStreamBeginCapture are seen
// once, at the driver.
#define __CUDA_API_VERSION_INTERNAL 1  // every variant (v1, _v2) under its real name
#include <cuda.h>

#include "cuda/real_driver.h"
#include "cuda/stream_registry.h"
#include "hooks/driver_hook.h"

using gpushim::real_driver;
using gpushim::driver_hook::call;

namespace {

CUresult destroy_stream(CUresult (*real)(CUstream), CUstream stream) {
  // The shim's pools only exist once it was initialized; the registry (device fences) always.
  if (gpushim::Shim* s = gpushim::Shim::existing())
    s->before_stream_destroy(stream);
  else
    gpushim::note_stream_destroying(stream);
  return call(real, stream);
}

// What a _ptsz variant's stream 0 means, and what CU_STREAM_PER_THREAD means anywhere: the calling
// thread's per-thread default stream.
bool per_thread_stream(CUstream s, bool ptsz) { return s == CU_STREAM_PER_THREAD || (ptsz && s == nullptr); }

bool still_capturing(CUstream stream, bool ptsz) {
  const gpushim::RealDriver& d = real_driver();
  const auto is_capturing = ptsz ? d.cuStreamIsCapturing_ptsz : d.cuStreamIsCapturing;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return is_capturing != nullptr && is_capturing(stream, &status) == CUDA_SUCCESS &&
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

template <typename F, typename... Rest>
CUresult begin_capture(F* real, bool ptsz, CUstream stream, Rest... rest) {
  // Counted before the capture starts, so that no pool can slip a query in between.
  const bool per_thread = per_thread_stream(stream, ptsz);
  gpushim::note_capture_began(stream, per_thread);
  const CUresult r = call(real, stream, rest...);
  if (r != CUDA_SUCCESS) gpushim::note_capture_ended(stream, per_thread);
  return r;
}

CUresult end_capture(decltype(&::cuStreamEndCapture) real, bool ptsz, CUstream stream, CUgraph* graph) {
  const CUresult r = call(real, stream, graph);
  // An invalidated capture ends here too; a stream that was not capturing is not in the list. One
  // refused for another reason (ended from another thread than began it, an unjoined fork) goes on:
  // it stays counted, or the pools would take the program's capture for over.
  if (r != CUDA_SUCCESS && still_capturing(stream, ptsz)) return r;
  gpushim::note_capture_ended(stream, per_thread_stream(stream, ptsz));
  return r;
}

}  // namespace

GPUSHIM_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
  const CUresult r = call(real_driver().cuStreamCreate, phStream, flags);
  if (r == CUDA_SUCCESS && phStream != nullptr) gpushim::note_stream_created(*phStream, flags);
  return r;
}

GPUSHIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  const CUresult r = call(real_driver().cuStreamCreateWithPriority, phStream, flags, priority);
  if (r == CUDA_SUCCESS && phStream != nullptr) gpushim::note_stream_created(*phStream, flags);
  return r;
}

GPUSHIM_EXPORT CUresult cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx greenCtx, unsigned int flags,
                                               int priority) {
  gpushim::note_program_context();  // a green context is not its device's primary one
  const CUresult r = call(real_driver().cuGreenCtxStreamCreate, phStream, greenCtx, flags, priority);
  if (r == CUDA_SUCCESS && phStream != nullptr) gpushim::learn_stream(*phStream);  // its context is the green one's
  return r;
}

GPUSHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return destroy_stream(real_driver().cuStreamDestroy_v2, hStream);
}

// The CUDA 2.x entry point, still exported by libcuda for programs built against it.
GPUSHIM_EXPORT CUresult cuStreamDestroy(CUstream hStream) { return destroy_stream(real_driver().cuStreamDestroy_v1, hStream); }

GPUSHIM_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  return begin_capture(real_driver().cuStreamBeginCapture_v1, false, hStream);
}

GPUSHIM_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return begin_capture(real_driver().cuStreamBeginCapture_v1_ptsz, true, hStream);
}

GPUSHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture(real_driver().cuStreamBeginCapture_v2, false, hStream, mode);
}

GPUSHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture(real_driver().cuStreamBeginCapture_v2_ptsz, true, hStream, mode);
}

GPUSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode* deps,
                                                    const CUgraphEdgeData* edges, size_t n, CUstreamCaptureMode mode) {
  return begin_capture(real_driver().cuStreamBeginCaptureToGraph, false, hStream, hGraph, deps, edges, n, mode);
}

GPUSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode* deps,
                                                         const CUgraphEdgeData* edges, size_t n,
                                                         CUstreamCaptureMode mode) {
  return begin_capture(real_driver().cuStreamBeginCaptureToGraph_ptsz, true, hStream, hGraph, deps, edges, n, mode);
}

GPUSHIM_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return end_capture(real_driver().cuStreamEndCapture, false, hStream, phGraph);
}

GPUSHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return end_capture(real_driver().cuStreamEndCapture_ptsz, true, hStream, phGraph);
}
