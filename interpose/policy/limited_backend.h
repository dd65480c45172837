// A Backend adaptor that enforces the device budget: memory past GPUSHIM_LIMIT is refused with
// CUDA_ERROR_OUT_OF_MEMORY, exactly as if the device were that small.
#pragma once

#include "policy/backend.h"
#include "policy/device_budget.h"

namespace gpushim {

class LimitedBackend final : public Backend {
 public:
  LimitedBackend(Backend& upstream, DeviceBudget& budget) : up_(upstream), budget_(budget) {}

  CUresult segment_alloc(size_t bytes, void** out) override {
    if (!budget_.try_charge(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUresult r = up_.segment_alloc(bytes, out);
    if (r == CUDA_SUCCESS) budget_.commit(bytes);
    else budget_.cancel(bytes);
    return r;
  }
  CUresult segment_free(void* p, size_t bytes) override {
    const CUresult r = up_.segment_free(p, bytes);
    if (r == CUDA_SUCCESS) budget_.uncharge(bytes);
    return r;
  }
  CUresult physical_create(size_t bytes, uint64_t* handle) override {
    if (!budget_.try_charge(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUresult r = up_.physical_create(bytes, handle);
    if (r == CUDA_SUCCESS) budget_.commit(bytes);
    else budget_.cancel(bytes);
    return r;
  }
  CUresult physical_release(uint64_t handle, size_t bytes) override {
    const CUresult r = up_.physical_release(handle, bytes);
    if (r == CUDA_SUCCESS) budget_.uncharge(bytes);
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
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override { return up_.map(va, size, h, off); }
  CUresult unmap(uintptr_t va, size_t size) override { return up_.unmap(va, size); }

 private:
  Backend& up_;
  DeviceBudget& budget_;
};

}  // namespace gpushim
