// The Backend over the real CUDA driver of one device: libcuda.so.1 reached with dlopen and the
// real dlsym, so the shim's own segments never pass through its own hooks (nor get counted twice).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "policy/backend.h"

namespace gpushim {

struct DriverApi;  // resolved driver functions (driver_backend.cpp)

// Null if libcuda.so.1 cannot be loaded or lacks what the pools need.
const DriverApi* driver_api();

class DriverBackend final : public Backend {
 public:
  explicit DriverBackend(int device);

  CUresult segment_alloc(size_t bytes, void** out) override;
  CUresult segment_free(void* p, size_t bytes) override;
  CUresult synchronize() override;
  uint64_t record_event(CUstream stream) override;
  bool event_done(uint64_t event) override;
  void release_event(uint64_t event) override;
  uint64_t record_device_fence() override;
  bool fence_done(uint64_t fence) override;
  void release_fence(uint64_t fence) override;
  bool wait_fence(uint64_t fence) override;
  bool foreign_stream(CUstream stream, uint64_t* event) override;
  bool synchronize_covers(uint64_t event) override;
  const std::atomic<bool>* foreign_streams_possible() override;
  bool event_on_callers_stream(uint64_t event, CUstream stream) override;
  bool capture_active() override;
  CUresult mem_info(size_t* free, size_t* total) override;

  size_t granularity() override;
  CUresult va_reserve(size_t size, uintptr_t hint, uintptr_t* out) override;
  CUresult va_free(uintptr_t va, size_t size) override;
  CUresult physical_create(size_t size, uint64_t* handle) override;
  CUresult physical_release(uint64_t handle, size_t size) override;
  CUresult map(uintptr_t va, size_t size, uint64_t handle, size_t offset) override;
  CUresult unmap(uintptr_t va, size_t size) override;

  // The device's primary context was reset or destroyed: the reference this backend held is gone
  // (a reset drops every reference) and so are the events it kept for reuse. The next use
  // retains the context again, as the runtime does after cudaDeviceReset.
  void forget_context();

  // Another device may now access this device's memory: `flags` for `peer`, given by
  // cuMemPoolSetAccess on its default pool, which the pools serve (`by_peer_access` false), or by
  // peer access enabled with cuCtxEnablePeerAccess (true). The two are kept apart and the
  // stronger holds (cudaMalloc and cudaMallocAsync memory share the vmm pool's mappings). Memory
  // from cuMemAlloc (the caching pool) follows the contexts' peer access by itself; the vmm pool's
  // mappings are given the access, those mapped already and every later one, as PyTorch's
  // expandable segments do for their peers. Never makes a context current or retains one while
  // nothing is mapped.
  CUresult grant_access(int peer, CUmemAccess_flags flags, bool by_peer_access);

  // The context current on the calling thread, as the pools see it: this device's primary
  // context (or none, which the runtime replaces by it), whose memory the pools hold; a context
  // the program made (cuCtxCreate), where CUDA's runtime allocates instead; or one destroyed by
  // another thread while current here, where CUDA refuses every call. Asked only once the
  // program has made a context (program_contexts_made).
  enum class CurrentContext { kPools, kProgramsOwn, kDestroyed };
  CurrentContext current_context();

 private:
  // Runs `fn` with this device's primary context current on the calling thread, restoring the
  // caller's context afterwards (the runtime may not have made it current on this thread yet).
  template <typename F>
  CUresult in_context(F&& fn);

  const int device_;
  const DriverApi* api_;
  std::mutex retain_mu_;                  // retaining, and forgetting, the primary context
  std::atomic<CUcontext> primary_{nullptr};
  CUresult retain_result_ = CUDA_ERROR_NOT_INITIALIZED;  // why primary_ is null, if it is (under retain_mu_)
  std::mutex events_mu_;
  std::vector<CUevent> spare_events_;  // recycled: creating events costs driver time
  // What map() grants beside this device's own access, and the ranges it mapped (va -> size), so
  // that a later grant reaches them. Under one lock with the map and unmap calls: a grant never
  // misses a mapping made meanwhile.
  struct PeerAccess {
    CUmemAccess_flags by_pool = CU_MEM_ACCESS_FLAGS_PROT_NONE, by_peer = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CUmemAccessDesc desc(int peer) const;  // `peer`'s access on a mapping: the stronger of the two
  };
  std::mutex access_mu_;
  std::map<int, PeerAccess> peers_;
  std::map<uintptr_t, size_t> mapped_;
};

}  // namespace gpushim
