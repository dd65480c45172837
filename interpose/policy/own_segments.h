// GPUSHIM_OWN_SEGMENT_MIN: allocations at least `min_bytes` large get a driver segment of their
// own (cuMemAlloc), never shared, split or cached; smaller ones go to the wrapped pool. Legacy
// CUDA IPC describes whole driver allocations, so such a block is exported exactly, and pointer
// queries on it need no translation. The price: those allocations cost a real cuMemAlloc and
// cuMemFree each, as without a pool (programs that share memory over IPC, such as PyTorch
// multiprocessing, usually cache such buffers themselves).
//
// Composes like RMM's binning resource: any pool can be wrapped, and the replay builds the same.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "policy/reservation_counter.h"

namespace gpushim {

class OwnSegmentResource final : public DeviceMemoryResource {
 public:
  // `inner` must allocate through `*counter`, which this resource then also uses for its own
  // segments, so that the reserved figure covers both exactly.
  OwnSegmentResource(std::unique_ptr<ReservationCounter> counter, std::unique_ptr<DeviceMemoryResource> inner,
                     uint64_t min_bytes, uint64_t round);
  ~OwnSegmentResource() override;

  CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) override;
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered) override;
  bool contains(const void* p) const override;
  void figures(PoolFigures* out) const override;
  void release_cached() override;
  void release_before_reset() override;
  void forget_streams(absl::FunctionRef<bool(CUstream)> doomed) override { inner_->forget_streams(doomed); }
  bool find_block(const void* p, uintptr_t* base, uint64_t* size) const override;
  const char* ipc_export_refusal(const void* block, uint64_t size) const override;

 private:
  // Frees deferred while a graph was being captured (cuMemFree there would invalidate it).
  void free_deferred();  // requires mu_

  std::unique_ptr<ReservationCounter> counter_;  // owns the backend view both parts use
  std::unique_ptr<DeviceMemoryResource> inner_;
  const uint64_t min_bytes_;
  const uint64_t round_;
  mutable std::mutex mu_;
  std::map<uintptr_t, uint64_t> own_;                       // live own segments: base -> size
  std::vector<std::pair<void*, uint64_t>> deferred_;        // freed during a capture
  uint64_t allocs_ = 0, frees_ = 0;
};

}  // namespace gpushim
