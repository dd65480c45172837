// A Backend adaptor that tells an observer about the memory a pool takes from and gives back to
// the device (segments, and mappings under the vmm policy). The trace uses it to record segment
// events; pools stay unaware of who watches.
#pragma once

#include <cstdint>

#include "policy/backend.h"

namespace gpushim {

class SegmentObserver {
 public:
  enum class Change : uint8_t { kAlloc, kFree, kMap, kUnmap };
  virtual ~SegmentObserver() = default;
  // Called after the upstream call succeeded, on the thread that made it (possibly under the
  // pool's lock: implementations must be quick and must not call back into the pool).
  virtual void on_segment(Change change, uintptr_t addr, uint64_t bytes) = 0;
};

class ObservedBackend final : public Backend {
 public:
  ObservedBackend(Backend& upstream, SegmentObserver& observer) : up_(upstream), obs_(observer) {}

  CUresult segment_alloc(size_t bytes, void** out) override {
    const CUresult r = up_.segment_alloc(bytes, out);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kAlloc, reinterpret_cast<uintptr_t>(*out), bytes);
    return r;
  }
  CUresult segment_free(void* p, size_t bytes) override {
    const CUresult r = up_.segment_free(p, bytes);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kFree, reinterpret_cast<uintptr_t>(p), bytes);
    return r;
  }
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override {
    const CUresult r = up_.map(va, size, h, off);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kMap, va, size);
    return r;
  }
  CUresult unmap(uintptr_t va, size_t size) override {
    const CUresult r = up_.unmap(va, size);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kUnmap, va, size);
    return r;
  }

  CUresult synchronize() override { return up_.synchronize(); }
  uint64_t record_event(CUstream s) override { return up_.record_event(s); }
  bool event_done(uint64_t e) override { return up_.event_done(e); }
  void release_event(uint64_t e) override { up_.release_event(e); }
  bool capture_active() override { return up_.capture_active(); }
  CUresult mem_info(size_t* free, size_t* total) override { return up_.mem_info(free, total); }
  size_t granularity() override { return up_.granularity(); }
  CUresult va_reserve(size_t size, uintptr_t hint, uintptr_t* out) override { return up_.va_reserve(size, hint, out); }
  CUresult va_free(uintptr_t va, size_t size) override { return up_.va_free(va, size); }
  CUresult physical_create(size_t bytes, uint64_t* handle) override { return up_.physical_create(bytes, handle); }
  CUresult physical_release(uint64_t handle, size_t bytes) override { return up_.physical_release(handle, bytes); }

 private:
  Backend& up_;
  SegmentObserver& obs_;
};

}  // namespace gpushim
