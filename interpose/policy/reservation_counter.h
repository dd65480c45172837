// A Backend adaptor that counts what passes through it to the driver: bytes held (segments and
// physical chunks) and their peak. Lets a resource composed of several parts over one backend
// report one exact "reserved" figure, as a single pool would.
#pragma once

#include <algorithm>
#include <atomic>

#include "policy/backend.h"

namespace gpushim {

class ReservationCounter final : public Backend {
 public:
  explicit ReservationCounter(Backend& upstream) : up_(upstream) {}

  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

  CUresult segment_alloc(size_t bytes, void** out) override { return counted(bytes, up_.segment_alloc(bytes, out)); }
  CUresult segment_free(void* p, size_t bytes) override { return uncounted(bytes, up_.segment_free(p, bytes)); }
  CUresult physical_create(size_t bytes, uint64_t* handle) override {
    return counted(bytes, up_.physical_create(bytes, handle));
  }
  CUresult physical_release(uint64_t handle, size_t bytes) override {
    return uncounted(bytes, up_.physical_release(handle, bytes));
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
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override { return up_.map(va, size, h, off); }
  CUresult unmap(uintptr_t va, size_t size) override { return up_.unmap(va, size); }

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

  Backend& up_;
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace gpushim
