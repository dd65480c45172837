// A simulated device for the pools: addresses without memory, a fixed capacity, counted driver
// calls, and events whose completion the caller controls. gpushim-analyze's replay and the unit
// tests run the real pool code on it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "policy/backend.h"

namespace gpushim {

struct SimCounters {
  uint64_t segment_allocs = 0, segment_frees = 0;
  uint64_t physical_creates = 0, physical_releases = 0;
  uint64_t maps = 0, unmaps = 0, va_reserves = 0, va_frees = 0;
  uint64_t synchronizes = 0, events_recorded = 0, fences_recorded = 0;
  uint64_t event_queries = 0;
  uint64_t fence_waits = 0;  // wait_fence calls: the host waited for the work before one fence (not in driver_calls)
  uint64_t driver_calls() const {
    return segment_allocs + segment_frees + physical_creates + physical_releases + maps + unmaps + va_reserves +
           va_frees + synchronizes + events_recorded + fences_recorded;
  }
};

class SimBackend final : public Backend {
 public:
  explicit SimBackend(uint64_t capacity, size_t granularity = 2ull << 20);

  CUresult segment_alloc(size_t bytes, void** out) override;
  CUresult segment_free(void* p, size_t bytes) override;
  CUresult synchronize() override;
  uint64_t record_event(CUstream stream) override;
  bool event_done(uint64_t event) override;
  void release_event(uint64_t event) override;
  // A fence is one more event here: the simulation has no streams to cover.
  uint64_t record_device_fence() override;
  bool fence_done(uint64_t fence) override { return event_done(fence); }
  void release_fence(uint64_t fence) override { release_event(fence); }
  bool wait_fence(uint64_t fence) override;
  bool foreign_stream(CUstream stream, uint64_t* event) override;
  bool synchronize_covers(uint64_t event) override { return foreign_events_.count(event) == 0; }
  const std::atomic<bool>* foreign_streams_possible() override { return &any_foreign_; }
  bool capture_active() override { return capturing_; }
  CUresult mem_info(size_t* free, size_t* total) override;

  size_t granularity() override { return granularity_; }
  CUresult va_reserve(size_t size, uintptr_t hint, uintptr_t* out) override;
  CUresult va_free(uintptr_t va, size_t size) override;
  CUresult physical_create(size_t size, uint64_t* handle) override;
  CUresult physical_release(uint64_t handle, size_t size) override;
  CUresult map(uintptr_t va, size_t size, uint64_t handle, size_t offset) override;
  CUresult unmap(uintptr_t va, size_t size) override;

  // ---- test and replay controls ----
  // When false, recorded events stay pending until complete_events() or synchronize().
  void set_events_complete_at_once(bool v) { events_at_once_ = v; }
  void complete_events() {
    pending_events_.clear();
    due_.clear();
    foreign_events_.clear();
  }
  // `stream` is another context's (Backend::foreign_stream): the event of a block freed there
  // is recorded at the free and stays pending, whatever synchronize() does, until
  // complete_events().
  void set_foreign_stream(CUstream stream) {
    foreign_streams_.insert(stream);
    any_foreign_ = true;
  }
  void set_capturing(bool v) { capturing_ = v; }
  // Replay of a recorded run: from now on fences and events complete only as the run saw them
  // (and at a wait or a synchronization). script_completion says that the `ordinal`-th fence (or
  // event) recorded, from 1, completes at its (queries_before + 1)-th query: counting queries, not
  // trace positions, keeps "not yet" answers inside one pool operation as they were.
  void follow_script() {
    scripted_ = true;
    events_at_once_ = false;
  }
  void script_completion(bool fence, uint64_t ordinal, uint64_t queries_before) {
    script_[{fence, ordinal}] = queries_before;
  }
  uint64_t fence_calls() const { return fence_calls_; }
  // Replay of a recorded run: the next segment of `bytes` goes to `addr`, where the run's driver put
  // it (until forget_placements). Pools break ties between equal free blocks by address, and a
  // real driver's addresses need not rise with each allocation as this simulation's do (an H200
  // hands a caching pool's large segments out downwards): with its own addresses a replay would
  // pick other blocks than the run did. A placement of another size, or one over a live segment
  // (the replay departed from the run), is passed over and the simulation's own address is used.
  void place_next_segment(uintptr_t addr, uint64_t bytes) { placements_.push_back({addr, bytes}); }
  // The same for the next virtual address range (vmm): also whether a range asked for right after
  // another (the hint) was had there, as the run's driver decided.
  void place_next_reservation(uintptr_t addr, uint64_t bytes) { reservation_placements_.push_back({addr, bytes}); }
  void forget_placements() {
    placements_.clear();
    reservation_placements_.clear();
  }

  // ---- GPU time ----
  // The host's clock: the replay sets it to each event's recorded time. Events and fences carry
  // the time they were recorded at, and scripted ones what the run said of them (samples below).
  void set_clock(uint64_t now_ns) { now_ns_ = std::max(now_ns_, now_ns); }
  uint64_t clock() const { return now_ns_; }
  // From now on an event or fence recorded at host time r completes once the clock reaches
  // completes_at(r) (never before r; non-decreasing in r, as the device runs its work in order),
  // or at a wait for it or a later fence, or at a synchronization.
  void model_completion(std::function<uint64_t(uint64_t)> completes_at) {
    completes_at_ = std::move(completes_at);
    scripted_ = false;
    events_at_once_ = false;
  }
  // What a scripted replay learned of the device: when each fence or event was recorded, the
  // last query that answered "not yet" (0: none) and the query that first answered "complete".
  // The completion lies in (pending_ns, done_ns]. Waits and synchronizations give no sample.
  struct CompletionSample {
    bool fence = false;
    uint64_t recorded_ns = 0, pending_ns = 0, done_ns = 0;
  };
  const std::vector<CompletionSample>& completion_samples() const { return samples_; }
  uint64_t event_calls() const { return event_calls_; }
  // Fails the next `n` memory requests (segments or physical chunks) with OUT_OF_MEMORY.
  void fail_next(int n) { fail_next_ = n; }
  uint64_t used() const { return used_; }
  uint64_t peak_used() const { return peak_used_; }
  uint64_t capacity() const { return capacity_; }
  const SimCounters& counters() const { return counters_; }
  size_t live_events() const { return live_events_.size(); }
  // Virtual memory: which physical allocation (and offset in it) backs `va`; false if unmapped.
  // Lets tests check that a live block's backing never changes while it lives.
  bool translate(uintptr_t va, uint64_t* handle, uint64_t* offset) const;
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  size_t reservations() const { return reservations_.size(); }

 private:
  bool take(uint64_t bytes);
  bool range_free(uintptr_t a, uint64_t bytes) const;
  bool va_range_free(uintptr_t a, uint64_t bytes) const;
  uint64_t capacity_;
  size_t granularity_;
  uint64_t used_ = 0, peak_used_ = 0;
  uintptr_t next_addr_ = 0x7f0000000000ull;  // addresses are never reused, so stale pointers show up
  uintptr_t next_va_ = 0x100000000000ull;
  uint64_t next_handle_ = 1, next_event_ = 1;
  std::map<uintptr_t, uint64_t> segments_;
  std::deque<std::pair<uintptr_t, uint64_t>> placements_;  // (address, size) for the next segments
  std::deque<std::pair<uintptr_t, uint64_t>> reservation_placements_;  // and for the next ranges
  std::map<uint64_t, uint64_t> physical_;  // handle -> size
  // The driver's rules are checked as the real one (and tests/fakecuda) checks them: a mapping
  // lies inside one reservation, never over another, from offset 0 of its handle ("currently must
  // be zero", cuda.h); unmap and va_free take whole mappings and whole, empty reservations.
  struct Mapping {
    uint64_t size = 0;
    uint64_t handle = 0;
  };
  std::map<uintptr_t, Mapping> mappings_;       // va -> mapping
  std::map<uintptr_t, uint64_t> reservations_;  // va -> size
  uint64_t mapped_bytes_ = 0;
  std::set<uint64_t> pending_events_, live_events_;
  std::set<CUstream> foreign_streams_;
  std::atomic<bool> any_foreign_{false};
  std::set<uint64_t> foreign_events_;  // recorded in another context: pending until complete_events()
  bool events_at_once_ = true;
  bool scripted_ = false;
  struct Tracked {
    bool fence = false;
    uint64_t ordinal = 0, queries = 0;
    uint64_t recorded_ns = 0, pending_ns = 0;
  };
  struct Due {
    uint64_t recorded_ns = 0, done_ns = 0;
  };
  uint64_t now_ns_ = 0;
  std::function<uint64_t(uint64_t)> completes_at_;  // modelled: recording time -> completion
  std::map<uint64_t, Due> due_;                     // modelled: pending handle -> its times
  uint64_t waited_through_ns_ = 0;  // modelled: all work recorded up to here is done (a wait)
  bool waited_any_ = false;
  std::vector<CompletionSample> samples_;
  std::map<uint64_t, Tracked> tracked_;                  // scripted: live handle -> its number
  std::map<std::pair<bool, uint64_t>, uint64_t> script_;  // (fence, ordinal) -> queries before done
  uint64_t fence_calls_ = 0, event_calls_ = 0;
  bool capturing_ = false;
  int fail_next_ = 0;
  SimCounters counters_;
};

}  // namespace gpushim
