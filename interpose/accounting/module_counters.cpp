#include "accounting/module_counters.h"

namespace gpushim {
namespace {

std::atomic<uint64_t> g_next_table_id{1};

}  // namespace

ModuleCounters::ModuleCounters()
    : slots_(new Slot[kSlots]), id_(g_next_table_id.fetch_add(1, std::memory_order_relaxed)) {
  // The first slots are the overflow slots, one per kind, claimed up front so they always exist.
  for (int k = 0; k < kMemoryKinds; ++k)
    slots_[k].key.store(pack(kOverflowModule, -1, static_cast<MemoryKind>(k)), std::memory_order_relaxed);
}

ModuleTotals& ModuleCounters::find(uint64_t key) {
  constexpr size_t kFirst = kMemoryKinds;
  static_assert((kProbeSlots & (kProbeSlots - 1)) == 0, "probing masks");
  constexpr size_t kMask = kProbeSlots - 1;
  size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 40) & kMask;
  for (size_t probes = 0; probes < kProbeSlots; ++probes, i = (i + 1) & kMask) {
    Slot& slot = slots_[kFirst + i];
    uint64_t cur = slot.key.load(std::memory_order_acquire);
    if (cur == key) return slot.counters;
    if (cur == 0) {
      if (slot.key.compare_exchange_strong(cur, key, std::memory_order_acq_rel)) return slot.counters;
      if (cur == key) return slot.counters;  // another thread claimed it for the same key
    }
  }
  return slots_[static_cast<size_t>(key & 0xFF)].counters;
}

}  // namespace gpushim
