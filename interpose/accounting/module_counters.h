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
#include "accounting/memory_kind.h"
#include "stacks/module_map.h"

namespace gpushim {

class ModuleCounters {
 public:
  static constexpr size_t kSlots = 1024;
  // Module id of the overflow slot in for_each.
  static constexpr ModuleId kOverflowModule = 0xFFFF;

  ModuleCounters();
  ModuleCounters(const ModuleCounters&) = delete;
  ModuleCounters& operator=(const ModuleCounters&) = delete;

  // The counters of one combination; never null.
  MemoryCounters& at(ModuleId module, int device, MemoryKind kind);

  // Calls fn(module, device, kind, const MemoryCounters&) for every combination used so far
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
    MemoryCounters counters;
  };
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace gpushim
