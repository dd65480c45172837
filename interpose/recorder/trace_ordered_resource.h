// Wraps a device's pool while a trace is recorded, so that the trace orders pool operations
// exactly as the pool performed them.
//
// A pool hands out blocks whose size depends on its state (a free block may be larger than the
// request and not worth splitting), and its state depends on the order of operations. Timestamps
// taken outside the pool's lock can invert two concurrent operations, and a replay of the trace
// would then hand out different sizes. Here each operation runs under one more lock and takes a
// sequence number inside it: the reader orders a device's pool events by it, so the trace's order
// is the pool's order and a replay reproduces it. A counter, not a clock read, keeps the lock short.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "policy/device_memory_resource.h"
#include "util/thread_block.h"

namespace gpushim::trace {

class TraceOrderedResource final : public DeviceMemoryResource {
 public:
  explicit TraceOrderedResource(std::unique_ptr<DeviceMemoryResource> pool) : pool_(std::move(pool)) {}

  CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CUresult r = pool_->allocate(req, out, allocated);
    t_last_op_seq() = ++seq_;
    return r;
  }
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CUresult r = pool_->deallocate(p, stream, stream_ordered);
    t_last_op_seq() = ++seq_;
    return r;
  }
  bool holds_payloads() const override { return pool_->holds_payloads(); }
  bool places_blocks() const override { return pool_->places_blocks(); }
  uint64_t max_split() const override { return pool_->max_split(); }
  CUresult allocate_with(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks& hooks) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CUresult r = pool_->allocate_with(req, out, allocated, hooks);
    // Refused (allocate() will serve it): the pool did nothing, so no number is used up.
    if (r != CUDA_ERROR_NOT_SUPPORTED) t_last_op_seq() = ++seq_;
    return r;
  }
  CUresult deallocate_with(void* p, CUstream stream, bool stream_ordered, PayloadHooks& hooks) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CUresult r = pool_->deallocate_with(p, stream, stream_ordered, hooks);
    // Not a block of this pool, or a refused free: the pool did nothing, so no number is used up.
    if (r != CUDA_ERROR_NOT_FOUND && r != CUDA_ERROR_NOT_PERMITTED) t_last_op_seq() = ++seq_;
    return r;
  }
  bool find_payload(const void* p, BlockPayload* out) const override { return pool_->find_payload(p, out); }
  void live_payload_blocks(std::vector<uintptr_t>* out) const override { pool_->live_payload_blocks(out); }
  void with_lock(absl::FunctionRef<void()> fn) const override { pool_->with_lock(fn); }
  bool contains(const void* p) const override { return pool_->contains(p); }
  bool find_block(const void* p, uintptr_t* base, uint64_t* size) const override {
    return pool_->find_block(p, base, size);
  }
  const char* ipc_export_refusal(const void* block, uint64_t size) const override {
    return pool_->ipc_export_refusal(block, size);
  }
  void figures(PoolFigures* out) const override { pool_->figures(out); }
  void release_cached() override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_->release_cached();
  }
  void release_before_reset() override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_->release_before_reset();
  }
  void trim_to(uint64_t keep) override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_->trim_to(keep);
  }
  // Forgetting streams records events (numbered like every other) and retags blocks, so it is a
  // pool operation of its own: numbered in the pool's order, and each stream whose blocks were
  // retagged reported to `retired` (one call of forget_streams: all of them, in the order the pool
  // met them, which is the order it recorded their events in).
  void forget_streams(absl::FunctionRef<bool(CUstream)> doomed) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CUstream> retired;
    pool_->forget_streams([&](CUstream s) {
      if (!doomed(s)) return false;
      if (std::find(retired.begin(), retired.end(), s) == retired.end()) retired.push_back(s);
      return true;
    });
    if (retired_)
      for (CUstream s : retired) retired_(s, retired.size());
  }
  void set_retired_observer(std::function<void(CUstream, size_t)> retired) { retired_ = std::move(retired); }

  // The calling thread's last allocate or deallocate, as numbered in the pool's order (from 1).
  static uint64_t last_op_seq() { return t_last_op_seq(); }
  // For what the pool does inside an operation (segments it takes or returns): the next number.
  // Only while the pool is working, i.e. under the lock this class holds.
  uint64_t next_seq_locked() { return ++seq_; }

 private:
  // Written and read once per traced operation: a slot of the front's static TLS block.
  static uint64_t& t_last_op_seq() { return thread_slot<uint64_t, ThreadSlot::kTraceOpSeq>(); }
  std::unique_ptr<DeviceMemoryResource> pool_;
  std::function<void(CUstream, size_t)> retired_;  // called under mu_: may take next_seq_locked()
  std::mutex mu_;
  uint64_t seq_ = 0;  // under mu_
};

}  // namespace gpushim::trace
