// What the recent frees were: for each, the block's address and size, its allocation's stack and
// the code address that freed it, so that a double free can name the allocation and the first
// free (as compute-sanitizer does). A bounded window: a fixed table indexed by a hash of the
// address, each free overwriting whatever older free shared its slot, so memory stays constant
// and the free path pays a few relaxed stores, no lock and no shared counter.
#pragma once

#include <atomic>
#include <cstdint>

#include "stacks/stack_table.h"

namespace gpushim {

class RecentFrees {
 public:
  static constexpr size_t kSlots = 2048;  // 64 KiB

  struct Entry {
    uint64_t size = 0;
    StackId alloc_stack = kEmptyStack;
    uintptr_t free_pc = 0;  // the return address of the outermost hook that freed it
  };

  void record(uintptr_t addr, uint64_t size, StackId alloc_stack, uintptr_t free_pc) {
    if (addr == 0) return;
    Slot& s = slots_[index(addr)];
    // The address last: a reader that sees it before and after reading the rest saw one free
    // (two frees racing for one slot can still mix; the message is a hint, never accounting).
    s.addr.store(0, std::memory_order_relaxed);
    s.size.store(size, std::memory_order_relaxed);
    s.stack.store(alloc_stack, std::memory_order_relaxed);
    s.free_pc.store(free_pc, std::memory_order_relaxed);
    s.addr.store(addr, std::memory_order_release);
  }

  // The last free of exactly `addr`, if the window still holds it.
  bool find(uintptr_t addr, Entry* out) const {
    if (addr == 0) return false;
    const Slot& s = slots_[index(addr)];
    if (s.addr.load(std::memory_order_acquire) != addr) return false;
    Entry e{s.size.load(std::memory_order_relaxed), s.stack.load(std::memory_order_relaxed),
            s.free_pc.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.addr.load(std::memory_order_relaxed) != addr) return false;
    *out = e;
    return true;
  }

 private:
  struct Slot {
    std::atomic<uintptr_t> addr{0};
    std::atomic<uint64_t> size{0};
    std::atomic<uintptr_t> free_pc{0};
    std::atomic<StackId> stack{kEmptyStack};
  };
  static size_t index(uintptr_t addr) {
    // Blocks are at least 256-byte aligned: the low bits say nothing.
    return static_cast<size_t>(((addr >> 8) * 0x9E3779B97F4A7C15ull) >> 53) & (kSlots - 1);
  }
  Slot slots_[kSlots];
};

}  // namespace gpushim
