// The virtual-memory API's physical allocations (cuMemCreate, cuMemImportFromShareableHandle) and
// their mappings, so that physical memory is counted exactly once: from its creation until CUDA
// frees it, which is when every reference is released (cuMemRelease, one per cuMemCreate or
// cuMemRetainAllocationHandle) AND every mapping is gone (cuMemUnmap). NCCL releases its handles
// right after mapping them; PyTorch's expandable segments unmap first: both orders are common.
//
// Only lifetimes live here. The records themselves (size, stack, module) are in the
// AllocationTracker like every other allocation, under key_of(handle).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "accounting/memory_kind.h"

namespace gpushim {

class VmmTracker {
 public:
  struct Physical {
    uint64_t handle = 0;
    uint64_t size = 0;
    int device = -1;
    MemoryKind kind = MemoryKind::kDevice;
  };

  // Handles are opaque integers, not addresses: in the allocation tracker they are keyed with the
  // top bit set, where no user-space pointer can be.
  static uintptr_t key_of(uint64_t handle) { return static_cast<uintptr_t>(handle | (1ull << 63)); }

  void created(const Physical& p);
  // Imported memory's size is learned from its first mapping (mapped() reports it then).
  void imported(uint64_t handle, int device);
  void retained(uint64_t handle);
  // True, with *gone filled, when this release ended the allocation's life.
  bool released(uint64_t handle, Physical* gone);
  // True, with *sized filled, when this mapping told the size of an imported allocation.
  bool mapped(uintptr_t va, uint64_t size, uint64_t handle, Physical* sized);
  // Appends the allocations whose life ended with this unmap.
  void unmapped(uintptr_t va, uint64_t size, std::vector<Physical>* gone);

  // Virtual address space (cuMemAddressReserve/Free): no memory, but shown in the report.
  void address_reserved(uintptr_t va, uint64_t size);
  void address_freed(uintptr_t va, std::vector<Physical>* gone);
  uint64_t reserved_va_bytes() const;

  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 private:
  struct Entry {
    Physical p;
    uint32_t refs = 1;
    uint32_t mappings = 0;
    bool sized = true;
  };
  struct Mapping {
    uint64_t size;
    uint64_t handle;
  };
  // Requires mu_: drops `it` if nothing holds it any more, appending it to *gone.
  void maybe_gone(absl::flat_hash_map<uint64_t, Entry>::iterator it, std::vector<Physical>* gone);
  void unmap_locked(uintptr_t va, uint64_t size, std::vector<Physical>* gone);

  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> handles_;
  std::map<uintptr_t, Mapping> mappings_;  // by mapped address
  absl::flat_hash_map<uintptr_t, uint64_t> reservations_;
  uint64_t reserved_va_bytes_ = 0;
};

}  // namespace gpushim
