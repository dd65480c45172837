// A Backend adaptor that enforces the device budget: memory past GPUSHIM_LIMIT is refused with
// CUDA_ERROR_OUT_OF_MEMORY, exactly as if the device were that small.
#pragma once

#include <algorithm>

#include "policy/forwarding_backend.h"
#include "policy/device_budget.h"

namespace gpushim {

class LimitedBackend final : public ForwardingBackend {
 public:
  LimitedBackend(Backend& upstream, DeviceBudget& budget) : ForwardingBackend(upstream), budget_(budget) {}

  CUresult segment_alloc(size_t bytes, void** out) override {
    return charged(bytes, [&] { return upstream().segment_alloc(bytes, out); });
  }
  CUresult segment_free(void* p, size_t bytes) override {
    const CUresult r = upstream().segment_free(p, bytes);
    if (r == CUDA_SUCCESS) budget_.uncharge(bytes);
    return r;
  }
  CUresult physical_create(size_t bytes, uint64_t* handle) override {
    return charged(bytes, [&] { return upstream().physical_create(bytes, handle); });
  }
  uint64_t creatable_bytes() override {
    return std::min(upstream().creatable_bytes(), budget_.room());
  }
  CUresult physical_release(uint64_t handle, size_t bytes) override {
    const CUresult r = upstream().physical_release(handle, bytes);
    if (r == CUDA_SUCCESS) budget_.uncharge(bytes);
    return r;
  }

 private:
  // Charged before the call, so that two threads cannot both pass the cap with the last bytes.
  template <typename Make>
  CUresult charged(size_t bytes, Make make) {
    if (!budget_.try_charge(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUresult r = make();
    if (r == CUDA_SUCCESS) budget_.commit(bytes);
    else budget_.cancel(bytes);
    return r;
  }

  DeviceBudget& budget_;
};

}  // namespace gpushim
