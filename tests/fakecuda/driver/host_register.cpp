// Page-locking memory the caller allocated: cuMemHostRegister(_v2), cuMemHostUnregister.
//
// A registered range becomes a kPinnedHost region over the caller's own pages (marked
// host_registered, so nothing here ever unmaps it): pointer attributes, cuMemHostGetDevicePointer
// and the asynchronous-copy rules (no staging, no implicit wait) then treat it as pinned memory,
// as CUDA does.
#include "driver.h"

namespace fakecuda {
namespace {

constexpr unsigned kKnownFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                 CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

bool OverlapsAnyRegion(State& s, std::uintptr_t p, std::size_t n) {
  if (FindRegion(s, p) != nullptr) return true;
  auto next = s.regions.upper_bound(p);
  return next != s.regions.end() && next->first < p + n;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (p == nullptr || bytesize == 0 || (Flags & ~kKnownFlags) != 0 || base + bytesize < base) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // I/O memory (a device's BAR) does not exist here.
  if ((Flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (OverlapsAnyRegion(s, base, bytesize)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Region r;
  r.base = base;
  r.size = bytesize;
  r.kind = RegionKind::kPinnedHost;
  r.device = ctx->device;
  r.ctx = ctx;
  r.buffer_id = NextId(s);
  r.host_registered = true;
  s.regions[base] = r;
  return CUDA_SUCCESS;
}

// The CUDA 3.2 ABI kept under the old name; same behaviour.
CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  return cuMemHostRegister_v2(p, bytesize, Flags);
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.regions.find(base);
  if (it == s.regions.end() || !it->second.host_registered) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  // Copies queued on the range may still read or write it: unregistering waits for the devices,
  // like freeing pinned memory.
  const std::uint64_t buffer_id = it->second.buffer_id;
  ++s.device_syncs;
  SyncAllDevices(s, lk);  // registered memory is every device's to copy from, as pinned memory is
  it = s.regions.find(base);
  if (it != s.regions.end() && it->second.buffer_id == buffer_id) s.regions.erase(it);
  return CUDA_SUCCESS;
}
