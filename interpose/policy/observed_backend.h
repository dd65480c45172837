// A Backend adaptor that tells an observer about the memory a pool takes from and gives back to
// the device (segments, and mappings under the vmm policy). The trace uses it to record segment
// events; pools stay unaware of who watches.
#pragma once

#include <cstdint>

#include "policy/forwarding_backend.h"

namespace gpushim {

class SegmentObserver {
 public:
  enum class Change : uint8_t { kAlloc, kFree, kMap, kUnmap };
  virtual ~SegmentObserver() = default;
  // Called after the upstream call succeeded, on the thread that made it (possibly under the
  // pool's lock: implementations must be quick and must not call back into the pool).
  virtual void on_segment(Change change, uintptr_t addr, uint64_t bytes) = 0;
};

class ObservedBackend final : public ForwardingBackend {
 public:
  ObservedBackend(Backend& upstream, SegmentObserver& observer) : ForwardingBackend(upstream), obs_(observer) {}

  CUresult segment_alloc(size_t bytes, void** out) override {
    const CUresult r = upstream().segment_alloc(bytes, out);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kAlloc, reinterpret_cast<uintptr_t>(*out), bytes);
    return r;
  }
  CUresult segment_free(void* p, size_t bytes) override {
    const CUresult r = upstream().segment_free(p, bytes);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kFree, reinterpret_cast<uintptr_t>(p), bytes);
    return r;
  }
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override {
    const CUresult r = upstream().map(va, size, h, off);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kMap, va, size);
    return r;
  }
  CUresult unmap(uintptr_t va, size_t size) override {
    const CUresult r = upstream().unmap(va, size);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kUnmap, va, size);
    return r;
  }

 private:
  SegmentObserver& obs_;
};

}  // namespace gpushim
