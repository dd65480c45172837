// A Backend adaptor that tells an observer about the memory a pool takes from and gives back to
// the device (segments, and mappings under the vmm policy), and about the moments that decide when
// freed memory may be reused (a fence or event seen complete for the first time, a wait, a
// synchronization). The trace uses it to record them in the pool's order, so a replay can complete
// its simulated fences exactly where the run saw them complete; pools stay unaware of who watches.
// Only a traced pool has one: untraced pools pay nothing.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "policy/forwarding_backend.h"
#include "policy/shared_mappings.h"

namespace gpushim {

class SegmentObserver {
 public:
  // kReserve, kRelease: virtual address ranges (vmm policy), whose addresses the pool's choices
  // depend on as they do on segments'.
  enum class Change : uint8_t { kAlloc, kFree, kMap, kUnmap, kReserve, kRelease };
  virtual ~SegmentObserver() = default;
  // Called after the upstream call succeeded, on the thread that made it (possibly under the
  // pool's lock: implementations must be quick and must not call back into the pool).
  // `shared` (kMap, kUnmap): the physical memory is mapped at another address too, so this call
  // neither takes nor gives back memory (shared_mappings.h).
  virtual void on_segment(Change change, uintptr_t addr, uint64_t bytes, bool shared) = 0;
  // Same rules. `ordinal`: the fence's (event's, synchronization's) number in the order the pool
  // recorded them, from 1; `queries_before`: how many queries of it had answered "not yet".
  enum class Reuse : uint8_t { kFenceDone, kFenceWaited, kEventDone, kSync };  // = trace::ReuseMoment
  virtual void on_reuse(Reuse what, uint64_t ordinal, uint64_t queries_before) {
    (void)what, (void)ordinal, (void)queries_before;
  }
};

class ObservedBackend final : public ForwardingBackend {
 public:
  ObservedBackend(Backend& upstream, SegmentObserver& observer) : ForwardingBackend(upstream), obs_(observer) {}

  CUresult segment_alloc(size_t bytes, void** out) override {
    const CUresult r = upstream().segment_alloc(bytes, out);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kAlloc, reinterpret_cast<uintptr_t>(*out), bytes, false);
    return r;
  }
  CUresult segment_free(void* p, size_t bytes) override {
    const CUresult r = upstream().segment_free(p, bytes);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kFree, reinterpret_cast<uintptr_t>(p), bytes, false);
    return r;
  }
  CUresult map(uintptr_t va, size_t size, uint64_t h, size_t off) override {
    const CUresult r = upstream().map(va, size, h, off);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kMap, va, size, !shared_.map(va, h));
    return r;
  }
  CUresult unmap(uintptr_t va, size_t size) override {
    const CUresult r = upstream().unmap(va, size);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kUnmap, va, size, !shared_.unmap(va));
    return r;
  }
  CUresult va_reserve(size_t size, uintptr_t hint, uintptr_t* out) override {
    const CUresult r = upstream().va_reserve(size, hint, out);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kReserve, *out, size, false);
    return r;
  }
  CUresult va_free(uintptr_t va, size_t size) override {
    const CUresult r = upstream().va_free(va, size);
    if (r == CUDA_SUCCESS) obs_.on_segment(SegmentObserver::Change::kRelease, va, size, false);
    return r;
  }

  // Fences and events are numbered by the call that recorded them, failed calls included, so the
  // numbers match a replay that makes the same calls. Events recorded in another context
  // (foreign_stream) are not: a trace does not say which context a stream was, so a replay makes
  // other calls there anyway.
  uint64_t record_device_fence() override {
    const uint64_t f = upstream().record_device_fence();
    ++fence_calls_;
    if (f != 0) fences_[f] = Pending{fence_calls_, 0};
    return f;
  }
  bool fence_done(uint64_t f) override {
    const bool done = upstream().fence_done(f);
    seen(fences_, f, done, SegmentObserver::Reuse::kFenceDone);
    return done;
  }
  bool wait_fence(uint64_t f) override {
    const bool ok = upstream().wait_fence(f);
    if (ok) {
      auto it = fences_.find(f);
      if (it != fences_.end() && !it->second.reported) {
        obs_.on_reuse(SegmentObserver::Reuse::kFenceWaited, it->second.ordinal, it->second.queries);
        it->second.reported = true;
      }
    }
    return ok;
  }
  void release_fence(uint64_t f) override {
    fences_.erase(f);
    upstream().release_fence(f);
  }
  uint64_t record_event(CUstream stream) override {
    const uint64_t e = upstream().record_event(stream);
    ++event_calls_;
    if (e != 0) events_[e] = Pending{event_calls_, 0};
    return e;
  }
  bool event_done(uint64_t e) override {
    const bool done = upstream().event_done(e);
    seen(events_, e, done, SegmentObserver::Reuse::kEventDone);
    return done;
  }
  void release_event(uint64_t e) override {
    events_.erase(e);
    upstream().release_event(e);
  }
  CUresult synchronize() override {
    const CUresult r = upstream().synchronize();
    if (r == CUDA_SUCCESS) {
      obs_.on_reuse(SegmentObserver::Reuse::kSync, ++syncs_, 0);
      // Everything recorded so far has completed: later queries say nothing new.
      for (auto& [h, p] : fences_) p.reported = true;
      for (auto& [h, p] : events_) p.reported = true;
    }
    return r;
  }

 private:
  struct Pending {
    uint64_t ordinal = 0;
    uint64_t queries = 0;  // answered "not yet" so far
    bool reported = false;
  };
  void seen(std::unordered_map<uint64_t, Pending>& m, uint64_t h, bool done, SegmentObserver::Reuse what) {
    auto it = m.find(h);
    if (it == m.end() || it->second.reported) return;
    if (!done) {
      ++it->second.queries;
      return;
    }
    obs_.on_reuse(what, it->second.ordinal, it->second.queries);
    it->second.reported = true;
  }

  SegmentObserver& obs_;
  // Under the pool's lock, like every call into a backend.
  std::unordered_map<uint64_t, Pending> fences_, events_;
  uint64_t fence_calls_ = 0, event_calls_ = 0, syncs_ = 0;
  SharedMappings shared_;
};

}  // namespace gpushim
