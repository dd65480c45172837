// Peer access between simulated devices: cuDeviceCanAccessPeer, cuCtxEnablePeerAccess,
// cuCtxDisablePeerAccess. All device memory lives in one address space here, so access always
// works; what is simulated is CUDA's bookkeeping and its error codes (enabling twice, disabling what
// was never enabled, a device with itself).
#include <set>
#include <utility>

#include "driver.h"

namespace fakecuda {
namespace {

// (context, peer context) pairs with access enabled; guarded by State::mu.
std::set<std::pair<const Context*, const Context*>>& Enabled() {
  static auto* s = new std::set<std::pair<const Context*, const Context*>>;
  return *s;
}

CUresult Peers(State& s, CUcontext peer_handle, Context** self, Context** peer) {
  if (CUresult r = CurrentContext(s, self); r != CUDA_SUCCESS) return r;
  *peer = ContextFromHandle(s, peer_handle, "cuCtxEnablePeerAccess/cuCtxDisablePeerAccess");
  if (*peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if ((*peer)->device == (*self)->device) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Device* a = nullptr;
  Device* b = nullptr;
  if (CUresult r = GetDevice(s, dev, &a); r != CUDA_SUCCESS) return r;
  if (CUresult r = GetDevice(s, peerDev, &b); r != CUDA_SUCCESS) return r;
  if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *canAccessPeer = dev != peerDev ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* self = nullptr;
  Context* peer = nullptr;
  if (CUresult r = Peers(s, peerContext, &self, &peer); r != CUDA_SUCCESS) return r;
  if (!Enabled().insert({self, peer}).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* self = nullptr;
  Context* peer = nullptr;
  if (CUresult r = Peers(s, peerContext, &self, &peer); r != CUDA_SUCCESS) return r;
  if (Enabled().erase({self, peer}) == 0) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}
