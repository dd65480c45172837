// Stream-capture entry points: we only count captures in progress, because while one runs a pool
// must neither synchronize nor query events (that would invalidate the user's graph).
#include <cuda_runtime_api.h>

#include "cuda/capture_state.h"
#include "cuda/real_symbols.h"

#include "hooks/export.h"

using gpushim::active_captures;
using gpushim::real_runtime;

namespace {

cudaError_t begin(decltype(gpushim::RealRuntime::cudaStreamBeginCapture) real, cudaStream_t s, cudaStreamCaptureMode m) {
  if (real == nullptr) return cudaErrorInitializationError;
  // Counted before the capture starts, so no pool can slip a sync in between.
  active_captures().fetch_add(1, std::memory_order_acq_rel);
  const cudaError_t err = real(s, m);
  if (err != cudaSuccess) active_captures().fetch_sub(1, std::memory_order_acq_rel);
  return err;
}

// `query` names the same stream as `s` for the non-_ptsz query function.
cudaError_t end(decltype(gpushim::RealRuntime::cudaStreamEndCapture) real, cudaStream_t s, cudaStream_t query,
                cudaGraph_t* g) {
  if (real == nullptr) return cudaErrorInitializationError;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const bool was_capturing = real_runtime().cudaStreamIsCapturing &&
                             real_runtime().cudaStreamIsCapturing(query, &status) == cudaSuccess &&
                             status != cudaStreamCaptureStatusNone;
  const cudaError_t err = real(s, g);
  // An invalidated capture still ends here; only a stream that was not capturing is not ours.
  if (was_capturing) active_captures().fetch_sub(1, std::memory_order_acq_rel);
  return err;
}

}  // namespace

GPUSHIM_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return begin(real_runtime().cudaStreamBeginCapture, stream, mode);
}

GPUSHIM_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return begin(real_runtime().cudaStreamBeginCapture_ptsz, stream, mode);
}

GPUSHIM_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  return end(real_runtime().cudaStreamEndCapture, stream, stream, graph);
}

GPUSHIM_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* graph) {
  return end(real_runtime().cudaStreamEndCapture_ptsz, stream, stream ? stream : cudaStreamPerThread, graph);
}
