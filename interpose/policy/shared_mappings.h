// Which mappings of a vmm pool hold physical memory that is mapped at another address too. The
// vmm arena maps one physical allocation at two addresses at once when it lends a chunk end to a
// block or borrows a chunk its stream freed (vmm_arena.h); the device holds that memory once, and
// the pool holds it until the last of its mappings goes. Adaptors that count reserved memory from
// the mappings they see (the ledger's PyTorch table, the trace's segment_map events) count a
// mapping only when it is its allocation's first, and an unmapping only when it is its last: the
// figure is then the pool's own (VmmArena's held bytes) rather than the address space it maps.
//
// Told by the handle each map call names, so it holds whatever the arena's reasons were. Called
// where the driver is (never on an allocation's path), serialized as the caller's map calls are.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"

namespace gpushim {

class SharedMappings {
 public:
  // A mapping of `handle` at `va`. True when the handle was mapped nowhere else.
  bool map(uintptr_t va, uint64_t handle) {
    handle_at_[va] = handle;
    return ++mappings_[handle] == 1;
  }
  // The mapping at `va` is gone. True when it was its handle's last; a mapping never seen (made
  // before this adaptor watched) counts as one of its own.
  bool unmap(uintptr_t va) {
    const auto at = handle_at_.find(va);
    if (at == handle_at_.end()) return true;
    const auto n = mappings_.find(at->second);  // there: map() counted the handle it stored
    handle_at_.erase(at);
    if (--n->second > 0) return false;
    mappings_.erase(n);
    return true;
  }

 private:
  absl::flat_hash_map<uintptr_t, uint64_t> handle_at_;   // mapped address -> handle
  absl::flat_hash_map<uint64_t, uint32_t> mappings_;     // handle -> addresses it is mapped at
};

}  // namespace gpushim
