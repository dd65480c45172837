// cuStreamAddCallback(_ptsz): the pre-CUDA-10 form of cuLaunchHostFunc. The callback runs on the
// stream's worker once all prior work on the stream is done, and gets the stream and its status
// (always CUDA_SUCCESS: simulated work does not fail). Unlike host functions it may not be
// captured: a capturing stream rejects it, which invalidates the capture.
#include "driver.h"

namespace fakecuda {
namespace {

CUresult AddCallback(CUstream hStream, CUstreamCallback callback, void* userData, unsigned int flags, bool ptsz) {
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamAddCallback"); r != CUDA_SUCCESS) return r;
  if (CUresult r = RefuseIfCapturing(s, st); r != CUDA_SUCCESS) return r;
  return Submit(s, st, [hStream, callback, userData] {
    HostFunctionScope scope("cuStreamAddCallback");
    callback(hStream, CUDA_SUCCESS, userData);
  });
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData, unsigned int flags) {
  return AddCallback(hStream, callback, userData, flags, false);
}

CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                          unsigned int flags) {
  return AddCallback(hStream, callback, userData, flags, true);
}
