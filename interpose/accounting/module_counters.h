// Exact live/peak/total counters per (module, device, kind): the report's per-library table.
//
// Updated on every allocation and free from any thread, so the table is lock-free: a fixed array
// of slots claimed with one compare-and-swap on first use and never released. Past its capacity
// (far more combinations than a real process has), new combinations share one overflow slot,
// reported as "(other modules)", so totals stay exact.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "accounting/memory_kind.h"
#include "stacks/module_map.h"

namespace gpushim {

struct ModuleSnapshot {
  uint64_t live_bytes = 0;
  uint64_t live_count = 0;
  uint64_t peak_bytes = 0;
  uint64_t total_allocs = 0;
  uint64_t total_frees = 0;
};

// One row's counters, lighter than MemoryCounters because they move on every allocation and free
// on top of the device's: two atomic additions each way (the live count is allocs - frees), and
// the peak raised only when passed.
class ModuleTotals {
 public:
  void on_alloc(uint64_t bytes) {
    const uint64_t live = live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    allocs_.fetch_add(1, std::memory_order_relaxed);
    uint64_t peak = peak_bytes_.load(std::memory_order_relaxed);
    while (live > peak && !peak_bytes_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }
  void on_free(uint64_t bytes) {
    live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    frees_.fetch_add(1, std::memory_order_relaxed);
  }
  // The same under a lock every writer of this row holds (see MemoryCounters::on_alloc_locked).
  void on_alloc_locked(uint64_t bytes) {
    const uint64_t live = live_bytes_.load(std::memory_order_relaxed) + bytes;
    live_bytes_.store(live, std::memory_order_relaxed);
    allocs_.store(allocs_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (live > peak_bytes_.load(std::memory_order_relaxed)) peak_bytes_.store(live, std::memory_order_relaxed);
  }
  void on_free_locked(uint64_t bytes) {
    live_bytes_.store(live_bytes_.load(std::memory_order_relaxed) - bytes, std::memory_order_relaxed);
    frees_.store(frees_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  ModuleSnapshot snapshot() const {
    ModuleSnapshot s;
    s.total_frees = frees_.load(std::memory_order_relaxed);
    s.total_allocs = allocs_.load(std::memory_order_relaxed);
    s.live_bytes = live_bytes_.load(std::memory_order_relaxed);
    s.peak_bytes = peak_bytes_.load(std::memory_order_relaxed);
    s.live_count = s.total_allocs >= s.total_frees ? s.total_allocs - s.total_frees : 0;
    return s;
  }

 private:
  std::atomic<uint64_t> live_bytes_{0};
  std::atomic<uint64_t> peak_bytes_{0};
  std::atomic<uint64_t> allocs_{0};
  std::atomic<uint64_t> frees_{0};
};

class ModuleCounters {
 public:
  static constexpr size_t kSlots = 1024;
  // Module id of the overflow slot in for_each.
  static constexpr ModuleId kOverflowModule = 0xFFFF;

  ModuleCounters();
  ModuleCounters(const ModuleCounters&) = delete;
  ModuleCounters& operator=(const ModuleCounters&) = delete;

  // The counters of one combination; never null.
  ModuleTotals& at(ModuleId module, int device, MemoryKind kind);

  // Calls fn(module, device, kind, const ModuleTotals&) for every combination used so far
  // (overflow slots only once something landed there).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (size_t i = 0; i < kSlots; ++i) {
      const uint64_t key = slots_[i].key.load(std::memory_order_acquire);
      if (key == 0 || (i < kMemoryKinds && slots_[i].counters.snapshot().total_allocs == 0)) continue;
      fn(static_cast<ModuleId>(key >> 24), static_cast<int>(static_cast<int16_t>((key >> 8) & 0xFFFF)),
         static_cast<MemoryKind>(key & 0xFF), slots_[i].counters);
    }
  }

  size_t memory_bytes() const { return sizeof(Slot) * kSlots; }

 private:
  struct Slot {
    std::atomic<uint64_t> key{0};  // 0: free; otherwise 1 << 40 | module << 24 | device << 8 | kind
    ModuleTotals counters;
  };
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace gpushim
