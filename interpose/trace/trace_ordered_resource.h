// Wraps a device's pool while a trace is recorded, so that the trace orders pool operations
// exactly as the pool performed them.
//
// A pool hands out blocks whose size depends on its state (a free block may be larger than the
// request and not worth splitting), and its state depends on the order of operations. Timestamps
// taken outside the pool's lock can invert two concurrent operations, and a replay of the trace
// would then hand out different sizes. Here each operation runs under one more lock and is timed
// inside it: the trace's order is the pool's order, and a replay reproduces it.
#pragma once

#include <memory>
#include <mutex>

#include "policy/device_memory_resource.h"
#include "util/clock.h"

namespace gpushim::trace {

class TraceOrderedResource final : public DeviceMemoryResource {
 public:
  explicit TraceOrderedResource(std::unique_ptr<DeviceMemoryResource> pool) : pool_(std::move(pool)) {}

  CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CUresult r = pool_->allocate(req, out, allocated);
    t_last_op_ns = now_ns();
    return r;
  }
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CUresult r = pool_->deallocate(p, stream, stream_ordered);
    t_last_op_ns = now_ns();
    return r;
  }
  bool contains(const void* p) const override { return pool_->contains(p); }
  void figures(PoolFigures* out) const override { pool_->figures(out); }
  void release_cached() override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_->release_cached();
  }

  // When the calling thread's last allocate or deallocate took effect (in the pool's order).
  static uint64_t last_op_ns() { return t_last_op_ns; }

 private:
  static inline thread_local uint64_t t_last_op_ns = 0;
  std::unique_ptr<DeviceMemoryResource> pool_;
  std::mutex mu_;
};

}  // namespace gpushim::trace
