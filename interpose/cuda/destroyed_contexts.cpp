#include "cuda/destroyed_contexts.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "cuda/real_driver.h"

namespace gpushim {
namespace {

constexpr std::size_t kKept = 64;

struct DestroyedList {
  std::mutex mu;  // writers only
  std::atomic<CUcontext> slots[kKept] = {};  // null: free; read without the lock
  std::atomic<std::size_t> listed{0};        // non-null slots
  uint64_t listed_at[kKept] = {};            // under mu: when each slot's context was listed
  uint64_t listings = 0;                     // under mu
};

// Never destroyed: hooks may run during exit.
DestroyedList& list() {
  static auto* l = new DestroyedList;
  return *l;
}

// Under l.mu.
std::atomic<CUcontext>* find(DestroyedList& l, CUcontext context) {
  for (auto& s : l.slots)
    if (s.load(std::memory_order_relaxed) == context) return &s;
  return nullptr;
}

}  // namespace

bool note_context_destroying(CUcontext context) {
  if (context == nullptr) return false;
  DestroyedList& l = list();
  const std::lock_guard<std::mutex> lock(l.mu);
  if (find(l, context) != nullptr) return false;
  std::atomic<CUcontext>* slot = find(l, nullptr);
  if (slot == nullptr) {  // all in use: the one listed longest ago goes
    slot = &l.slots[0];
    for (std::size_t i = 1; i < kKept; ++i)
      if (l.listed_at[i] < l.listed_at[slot - l.slots]) slot = &l.slots[i];
  } else {
    l.listed.fetch_add(1, std::memory_order_relaxed);
  }
  l.listed_at[slot - l.slots] = ++l.listings;
  slot->store(context, std::memory_order_release);
  return true;
}

void note_context_alive(CUcontext context) {
  DestroyedList& l = list();
  if (context == nullptr || l.listed.load(std::memory_order_acquire) == 0) return;
  const std::lock_guard<std::mutex> lock(l.mu);
  if (std::atomic<CUcontext>* slot = find(l, context)) {
    slot->store(nullptr, std::memory_order_release);
    l.listed.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool context_destroyed(CUcontext context) {
  DestroyedList& l = list();
  if (context == nullptr || l.listed.load(std::memory_order_acquire) == 0) return false;
  for (const auto& s : l.slots)
    if (s.load(std::memory_order_acquire) == context) return true;
  return false;
}

bool context_known_destroyed(CUcontext context) {
  if (!context_destroyed(context)) return false;
  if (device_of_primary_context(context) < 0) return true;
  note_context_alive(context);
  return false;
}

}  // namespace gpushim
