// The base of Backend adaptors (RMM-style): every call goes to the upstream backend unless the
// adaptor overrides it, so an adaptor states only what it changes (the cap, counting, observing).
#pragma once

#include "policy/backend.h"

namespace gpushim {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& upstream) : up_(upstream) {}

  CUresult segment_alloc(size_t bytes, void** out) override { return up_.segment_alloc(bytes, out); }
  CUresult segment_free(void* p, size_t bytes) override { return up_.segment_free(p, bytes); }
  CUresult synchronize() override { return up_.synchronize(); }
  uint64_t record_event(CUstream s) override { return up_.record_event(s); }
  bool event_done(uint64_t e) override { return up_.event_done(e); }
  void release_event(uint64_t e) override { up_.release_event(e); }
  uint64_t record_device_fence() override { return up_.record_device_fence(); }
  bool fence_done(uint64_t f) override { return up_.fence_done(f); }
  void release_fence(uint64_t f) override { up_.release_fence(f); }
  bool wait_fence(uint64_t f) override { return up_.wait_fence(f); }
  bool foreign_stream(CUstream s, uint64_t* event) override { return up_.foreign_stream(s, event); }
  bool synchronize_covers(uint64_t e) override { return up_.synchronize_covers(e); }
  const std::atomic<bool>* foreign_streams_possible() override { return up_.foreign_streams_possible(); }
  bool event_on_callers_stream(uint64_t e, CUstream s) override { return up_.event_on_callers_stream(e, s); }
  bool capture_active() override { return up_.capture_active(); }
  CUresult mem_info(size_t* free, size_t* total) override { return up_.mem_info(free, total); }
  uint64_t creatable_bytes() override { return up_.creatable_bytes(); }
  size_t granularity() override { return up_.granularity(); }
  CUresult va_reserve(size_t size, uintptr_t hint, uintptr_t* out) override { return up_.va_reserve(size, hint, out); }
  CUresult va_free(uintptr_t va, size_t size) override { return up_.va_free(va, size); }
  CUresult physical_create(size_t bytes, uint64_t* handle) override { return up_.physical_create(bytes, handle); }
  CUresult physical_release(uint64_t handle, size_t bytes) override { return up_.physical_release(handle, bytes); }
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override { return up_.map(va, size, h, off); }
  CUresult unmap(uintptr_t va, size_t size) override { return up_.unmap(va, size); }

 protected:
  Backend& upstream() { return up_; }

 private:
  Backend& up_;
};

}  // namespace gpushim
