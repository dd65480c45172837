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

#include "accounting/memory_counters.h"
#include "accounting/memory_figures.h"
#include "accounting/memory_kind.h"
#include "stacks/module_map.h"
#include "util/thread_block.h"

namespace gpushim {

// A row's figures are exactly the five (accounting/memory_figures.h).
using ModuleSnapshot = MemoryFigures;

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
    const uint64_t live = add_under_lock(live_bytes_, bytes);
    add_under_lock(allocs_, 1);
    if (live > peak_bytes_.load(std::memory_order_relaxed)) peak_bytes_.store(live, std::memory_order_relaxed);
  }
  void on_free_locked(uint64_t bytes) {
    add_under_lock(live_bytes_, 0 - bytes);
    add_under_lock(frees_, 1);
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
  // The probed slots are a power of two, so that a probe masks instead of dividing (a division
  // on every allocation and free showed in the pair's profile); the overflow slots come first.
  static constexpr size_t kProbeSlots = 1024;
  static constexpr size_t kSlots = kMemoryKinds + kProbeSlots;
  // Module id of the overflow slot in for_each.
  static constexpr ModuleId kOverflowModule = 0xFFFF;

  ModuleCounters();
  ModuleCounters(const ModuleCounters&) = delete;
  ModuleCounters& operator=(const ModuleCounters&) = delete;

  // The counters of one combination; never null. A thread keeps asking for the same one (its
  // allocation loop's module, device and kind), so the last answer is kept per thread: rows are
  // never released, so a remembered row stays valid for as long as its table lives.
  ModuleTotals& at(ModuleId module, int device, MemoryKind kind) {
    struct Last {
      uint64_t table, key;
      ModuleTotals* row;
    };
    Last& last = thread_slot<Last, ThreadSlot::kModuleRow>();  // zero: no table has id 0
    const uint64_t key = pack(module, device, kind);
    if (last.table == id_ && last.key == key) return *last.row;
    ModuleTotals& row = find(key);
    last = Last{id_, key, &row};
    return row;
  }

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
  // Bit 40 keeps every key non-zero (module 0 on device 0 would otherwise pack to 0).
  static uint64_t pack(uint64_t module, int device, MemoryKind kind) {
    return (1ull << 40) | (module << 24) | (static_cast<uint64_t>(static_cast<uint16_t>(device)) << 8) |
           static_cast<uint64_t>(kind);
  }
  ModuleTotals& find(uint64_t key);

  std::unique_ptr<Slot[]> slots_;
  // Distinct for every table the process ever makes (never 0), so that a thread's remembered row
  // cannot be taken for a row of a later table at the same address.
  const uint64_t id_;
};

}  // namespace gpushim
