#include "policy/own_segments.h"

namespace gpushim {

OwnSegmentResource::OwnSegmentResource(std::unique_ptr<ReservationCounter> counter,
                                       std::unique_ptr<DeviceMemoryResource> inner, uint64_t min_bytes, uint64_t round)
    : counter_(std::move(counter)), inner_(std::move(inner)), min_bytes_(min_bytes), round_(round ? round : 512) {}

OwnSegmentResource::~OwnSegmentResource() {
  // Only unit tests and the replay destroy a resource; the shim keeps its pools for the whole process.
  for (auto& [base, size] : own_) counter_->segment_free(reinterpret_cast<void*>(base), size);
  for (auto& [p, size] : deferred_) counter_->segment_free(p, size);
  inner_.reset();  // before the counter it allocates through
}

CUresult OwnSegmentResource::allocate(const AllocRequest& req, void** out, uint64_t* allocated) {
  if (req.size < min_bytes_) return inner_->allocate(req, out, allocated);
  const uint64_t size = req.size > UINT64_MAX - round_ ? 0 : (req.size + round_ - 1) / round_ * round_;
  if (size == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_deferred();
  }
  void* p = nullptr;
  CUresult r = counter_->segment_alloc(size, &p);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    // The pool may hold the memory we need, cached.
    inner_->release_cached();
    r = counter_->segment_alloc(size, &p);
  }
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(mu_);
  own_.emplace(reinterpret_cast<uintptr_t>(p), size);
  ++allocs_;
  *out = p;
  *allocated = size;
  return CUDA_SUCCESS;
}

CUresult OwnSegmentResource::deallocate(void* p, CUstream stream, bool stream_ordered) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = own_.find(reinterpret_cast<uintptr_t>(p));
  if (it == own_.end()) {
    lock.unlock();
    return inner_->deallocate(p, stream, stream_ordered);
  }
  const uint64_t size = it->second;
  own_.erase(it);
  // cuMemFree waits for the device, so memory still in use by queued work is never reused: the
  // semantics cudaFree promises, and stricter than cudaFreeAsync needs.
  if (counter_->capture_active()) {
    deferred_.emplace_back(p, size);
    return CUDA_SUCCESS;
  }
  free_deferred();
  lock.unlock();
  const CUresult r = counter_->segment_free(p, size);
  lock.lock();
  if (r != CUDA_SUCCESS) {
    own_.emplace(reinterpret_cast<uintptr_t>(p), size);
    return r;
  }
  ++frees_;
  return CUDA_SUCCESS;
}

void OwnSegmentResource::free_deferred() {
  if (deferred_.empty() || counter_->capture_active()) return;
  std::vector<std::pair<void*, uint64_t>> later;
  for (auto& [p, size] : deferred_) {
    if (counter_->segment_free(p, size) == CUDA_SUCCESS) ++frees_;
    else later.emplace_back(p, size);
  }
  deferred_.swap(later);
}

bool OwnSegmentResource::contains(const void* p) const {
  uintptr_t base = 0;
  uint64_t size = 0;
  if (find_block(p, &base, &size)) return true;
  {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [d, n] : deferred_)
      if (a >= reinterpret_cast<uintptr_t>(d) && a < reinterpret_cast<uintptr_t>(d) + n) return true;
  }
  return inner_->contains(p);
}

bool OwnSegmentResource::find_block(const void* p, uintptr_t* base, uint64_t* size) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = own_.upper_bound(a);
    if (it != own_.begin()) {
      --it;
      if (a < it->first + it->second) {
        *base = it->first;
        *size = it->second;
        return true;
      }
    }
  }
  return inner_->find_block(p, base, size);
}

const char* OwnSegmentResource::ipc_export_refusal(const void* block, uint64_t size) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (own_.count(reinterpret_cast<uintptr_t>(block))) return nullptr;  // a whole driver allocation
  }
  return inner_->ipc_export_refusal(block, size);
}

void OwnSegmentResource::figures(PoolFigures* out) const {
  inner_->figures(out);
  std::lock_guard<std::mutex> lock(mu_);
  // Own segments are reserved and handed out in full; the counter covers both parts exactly.
  out->reserved_bytes = counter_->held();
  out->peak_reserved_bytes = counter_->peak();
  out->segment_allocs += allocs_;
  out->segment_frees += frees_;
}

void OwnSegmentResource::release_cached() {
  inner_->release_cached();
  std::lock_guard<std::mutex> lock(mu_);
  free_deferred();
}

void OwnSegmentResource::release_before_reset() {
  inner_->release_before_reset();
  std::lock_guard<std::mutex> lock(mu_);
  free_deferred();
}

}  // namespace gpushim
