// A Backend adaptor that counts what passes through it to the driver: bytes held (segments and
// physical chunks) and their peak. Lets a resource composed of several parts over one backend
// report one exact "reserved" figure, as a single pool would.
#pragma once

#include <algorithm>
#include <atomic>

#include "policy/forwarding_backend.h"

namespace gpushim {

class ReservationCounter final : public ForwardingBackend {
 public:
  explicit ReservationCounter(Backend& upstream) : ForwardingBackend(upstream) {}

  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

  CUresult segment_alloc(size_t bytes, void** out) override { return counted(bytes, upstream().segment_alloc(bytes, out)); }
  CUresult segment_free(void* p, size_t bytes) override { return uncounted(bytes, upstream().segment_free(p, bytes)); }
  CUresult physical_create(size_t bytes, uint64_t* handle) override {
    return counted(bytes, upstream().physical_create(bytes, handle));
  }
  CUresult physical_release(uint64_t handle, size_t bytes) override {
    return uncounted(bytes, upstream().physical_release(handle, bytes));
  }

 private:
  CUresult counted(uint64_t bytes, CUresult r) {
    if (r != CUDA_SUCCESS) return r;
    const uint64_t now = held_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    uint64_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
    return r;
  }
  CUresult uncounted(uint64_t bytes, CUresult r) {
    if (r == CUDA_SUCCESS) held_.fetch_sub(bytes, std::memory_order_relaxed);
    return r;
  }

  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace gpushim
