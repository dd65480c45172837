#include "accounting/module_counters.h"

namespace gpushim {
namespace {

// Bit 40 keeps every key non-zero (module 0 on device 0 would otherwise pack to 0).
uint64_t pack(uint64_t module, int device, MemoryKind kind) {
  return (1ull << 40) | (module << 24) | (static_cast<uint64_t>(static_cast<uint16_t>(device)) << 8) |
         static_cast<uint64_t>(kind);
}

}  // namespace

ModuleCounters::ModuleCounters() : slots_(new Slot[kSlots]) {
  // The first slots are the overflow slots, one per kind, claimed up front so they always exist.
  for (int k = 0; k < kMemoryKinds; ++k)
    slots_[k].key.store(pack(kOverflowModule, -1, static_cast<MemoryKind>(k)), std::memory_order_relaxed);
}

ModuleTotals& ModuleCounters::at(ModuleId module, int device, MemoryKind kind) {
  const uint64_t key = pack(module, device, kind);
  constexpr size_t kFirst = kMemoryKinds;
  constexpr size_t kProbeSlots = kSlots - kFirst;
  size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 40) % kProbeSlots;
  for (size_t probes = 0; probes < kProbeSlots; ++probes, i = (i + 1) % kProbeSlots) {
    Slot& slot = slots_[kFirst + i];
    uint64_t cur = slot.key.load(std::memory_order_acquire);
    if (cur == key) return slot.counters;
    if (cur == 0) {
      if (slot.key.compare_exchange_strong(cur, key, std::memory_order_acq_rel)) return slot.counters;
      if (cur == key) return slot.counters;  // another thread claimed it for the same key
    }
  }
  return slots_[static_cast<size_t>(kind)].counters;
}

}  // namespace gpushim
