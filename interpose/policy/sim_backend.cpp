#include "policy/sim_backend.h"

#include <algorithm>
#include <iterator>

namespace gpushim {

SimBackend::SimBackend(uint64_t capacity, size_t granularity) : capacity_(capacity), granularity_(granularity) {}

bool SimBackend::take(uint64_t bytes) {
  if (fail_next_ > 0) {
    --fail_next_;
    return false;
  }
  if (bytes > capacity_ - used_) return false;
  used_ += bytes;
  peak_used_ = std::max(peak_used_, used_);
  return true;
}

bool SimBackend::range_free(uintptr_t a, uint64_t bytes) const {
  auto next = segments_.lower_bound(a);
  if (next != segments_.end() && next->first - a < bytes) return false;
  return next == segments_.begin() || std::prev(next)->first + std::prev(next)->second <= a;
}

CUresult SimBackend::segment_alloc(size_t bytes, void** out) {
  if (!take(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  ++counters_.segment_allocs;
  uintptr_t a = 0;
  if (!placements_.empty()) {
    const auto [at, size] = placements_.front();
    placements_.pop_front();
    if (size == bytes && at != 0 && at <= UINTPTR_MAX - bytes && range_free(at, bytes)) a = at;
  }
  // Else 2 MiB-aligned like cudaMalloc's large allocations, with a gap so neighbours never touch,
  // past any placed segment in the way.
  constexpr uintptr_t kAlign = 2ull << 20;
  const uintptr_t step = (bytes + 2 * kAlign - 1) / kAlign * kAlign;
  while (a == 0) {
    if (range_free(next_addr_, step)) {
      a = next_addr_;
      next_addr_ += step;
    } else {
      const auto in_the_way = std::prev(segments_.upper_bound(next_addr_ + step - 1));
      next_addr_ = (in_the_way->first + in_the_way->second + kAlign - 1) / kAlign * kAlign;
    }
  }
  segments_.emplace(a, bytes);
  *out = reinterpret_cast<void*>(a);
  return CUDA_SUCCESS;
}

CUresult SimBackend::segment_free(void* p, size_t) {
  auto it = segments_.find(reinterpret_cast<uintptr_t>(p));
  if (it == segments_.end()) return CUDA_ERROR_INVALID_VALUE;
  used_ -= it->second;
  segments_.erase(it);
  ++counters_.segment_frees;
  return CUDA_SUCCESS;
}

CUresult SimBackend::synchronize() {
  ++counters_.synchronizes;
  pending_events_.clear();
  due_.clear();
  return CUDA_SUCCESS;
}

bool SimBackend::wait_fence(uint64_t fence) {
  ++counters_.fence_waits;
  pending_events_.erase(fence);
  auto d = due_.find(fence);
  if (d != due_.end()) {
    // The device ran everything queued before this fence; the host did not run ahead meanwhile.
    waited_through_ns_ = std::max(waited_through_ns_, d->second.recorded_ns);
    waited_any_ = true;
    due_.erase(d);
  }
  return true;
}

uint64_t SimBackend::record_event(CUstream) {
  ++counters_.events_recorded;
  const uint64_t e = next_event_++;
  live_events_.insert(e);
  if (!events_at_once_) pending_events_.insert(e);
  if (scripted_) tracked_[e] = Tracked{false, ++event_calls_, 0, now_ns_, 0};
  if (completes_at_) due_[e] = Due{now_ns_, std::max(now_ns_, completes_at_(now_ns_))};
  return e;
}

bool SimBackend::foreign_stream(CUstream stream, uint64_t* event) {
  if (foreign_streams_.count(stream) == 0) return false;
  if (event != nullptr) {
    *event = record_event(stream);
    foreign_events_.insert(*event);
  }
  return true;
}

uint64_t SimBackend::record_device_fence() {
  const uint64_t e = record_event(nullptr);
  --counters_.events_recorded;
  ++counters_.fences_recorded;
  if (scripted_) {
    --event_calls_;
    tracked_[e] = Tracked{true, ++fence_calls_, 0, now_ns_, 0};
  }
  return e;
}

bool SimBackend::event_done(uint64_t event) {
  ++counters_.event_queries;
  if (foreign_events_.count(event) != 0) return false;
  if (scripted_ && pending_events_.count(event)) {
    auto it = tracked_.find(event);
    if (it != tracked_.end()) {
      Tracked& t = it->second;
      auto s = script_.find({t.fence, t.ordinal});
      if (s != script_.end() && t.queries >= s->second) {
        pending_events_.erase(event);
        samples_.push_back(CompletionSample{t.fence, t.recorded_ns, t.pending_ns, now_ns_});
      } else {
        ++t.queries;
        t.pending_ns = now_ns_;
      }
    }
  }
  if (completes_at_ && pending_events_.count(event)) {
    auto d = due_.find(event);
    if (d == due_.end() || now_ns_ >= d->second.done_ns ||
        (waited_any_ && d->second.recorded_ns <= waited_through_ns_)) {
      pending_events_.erase(event);
      if (d != due_.end()) due_.erase(d);
    }
  }
  return pending_events_.count(event) == 0;
}

void SimBackend::release_event(uint64_t event) {
  live_events_.erase(event);
  foreign_events_.erase(event);
  if (pending_events_.erase(event)) {
    // Released while the run still said "not yet": a lower bound on its completion only.
    auto t = tracked_.find(event);
    if (t != tracked_.end() && t->second.pending_ns != 0)
      samples_.push_back(CompletionSample{t->second.fence, t->second.recorded_ns, t->second.pending_ns, 0});
  }
  tracked_.erase(event);
  due_.erase(event);
}

CUresult SimBackend::mem_info(size_t* free, size_t* total) {
  if (free) *free = capacity_ - used_;
  if (total) *total = capacity_;
  return CUDA_SUCCESS;
}

CUresult SimBackend::va_reserve(size_t size, uintptr_t hint, uintptr_t* out) {
  if (size == 0 || size % granularity_) return CUDA_ERROR_INVALID_VALUE;
  ++counters_.va_reserves;
  uintptr_t va = 0;
  if (!reservation_placements_.empty()) {
    const auto [at, bytes] = reservation_placements_.front();
    reservation_placements_.pop_front();
    if (bytes == size && at != 0 && at % granularity_ == 0 && at <= UINTPTR_MAX - size && va_range_free(at, size)) va = at;
  }
  if (va == 0) {
    // Honour a hint when nothing was handed out there yet (lets a pool grow a range in place), and
    // stay clear of ranges placed where a run's driver put them.
    if (hint && hint >= next_va_) next_va_ = hint;
    while (!va_range_free(next_va_, size)) {
      const auto in_the_way = std::prev(reservations_.upper_bound(next_va_ + size - 1));
      next_va_ = (in_the_way->first + in_the_way->second + granularity_ - 1) / granularity_ * granularity_;
    }
    va = next_va_;
    next_va_ += size;
  }
  *out = va;
  reservations_.emplace(va, size);
  return CUDA_SUCCESS;
}

bool SimBackend::va_range_free(uintptr_t a, uint64_t bytes) const {
  auto next = reservations_.lower_bound(a);
  if (next != reservations_.end() && next->first - a < bytes) return false;
  return next == reservations_.begin() || std::prev(next)->first + std::prev(next)->second <= a;
}

CUresult SimBackend::va_free(uintptr_t va, size_t size) {
  auto it = reservations_.find(va);
  if (it == reservations_.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = mappings_.lower_bound(va);
  if (m != mappings_.end() && m->first < va + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  reservations_.erase(it);
  ++counters_.va_frees;
  return CUDA_SUCCESS;
}

CUresult SimBackend::physical_create(size_t size, uint64_t* handle) {
  if (size == 0 || size % granularity_) return CUDA_ERROR_INVALID_VALUE;
  if (!take(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  ++counters_.physical_creates;
  *handle = next_handle_++;
  physical_.emplace(*handle, size);
  return CUDA_SUCCESS;
}

CUresult SimBackend::physical_release(uint64_t handle, size_t) {
  auto it = physical_.find(handle);
  if (it == physical_.end()) return CUDA_ERROR_INVALID_VALUE;
  used_ -= it->second;
  physical_.erase(it);
  ++counters_.physical_releases;
  return CUDA_SUCCESS;
}

CUresult SimBackend::map(uintptr_t va, size_t size, uint64_t handle, size_t offset) {
  auto it = physical_.find(handle);
  if (it == physical_.end() || offset != 0 || size == 0 || size > it->second) return CUDA_ERROR_INVALID_VALUE;
  if (va % granularity_ || size % granularity_) return CUDA_ERROR_INVALID_VALUE;
  auto r = reservations_.upper_bound(va);
  if (r == reservations_.begin() || va + size > std::prev(r)->first + std::prev(r)->second) return CUDA_ERROR_INVALID_VALUE;
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > va) return CUDA_ERROR_INVALID_VALUE;
  mappings_.emplace(va, Mapping{size, handle});
  mapped_bytes_ += size;
  ++counters_.maps;
  return CUDA_SUCCESS;
}

CUresult SimBackend::unmap(uintptr_t va, size_t size) {
  auto it = mappings_.find(va);
  if (it == mappings_.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  mapped_bytes_ -= size;
  mappings_.erase(it);
  ++counters_.unmaps;
  return CUDA_SUCCESS;
}

bool SimBackend::translate(uintptr_t va, uint64_t* handle, uint64_t* offset) const {
  auto it = mappings_.upper_bound(va);
  if (it == mappings_.begin()) return false;
  --it;
  if (va >= it->first + it->second.size) return false;
  *handle = it->second.handle;
  *offset = va - it->first;
  return true;
}

}  // namespace gpushim
