#include "cuda/destroyed_contexts.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>

namespace gpushim {
namespace {

// A program that makes and destroys contexts in a loop gets its handles back from the driver
// (taking them off the list); the bound only keeps a pathological one from growing it forever.
constexpr std::size_t kKept = 256;

struct DestroyedList {
  std::mutex mu;
  CUcontext ring[kKept] = {};
  std::size_t next = 0;  // where the next one goes, oldest overwritten
  std::atomic<bool> any{false};  // one was ever destroyed (the lock-free answer until then)
};

// Never destroyed: hooks may run during exit.
DestroyedList& list() {
  static auto* l = new DestroyedList;
  return *l;
}

}  // namespace

void note_context_destroyed(CUcontext context) {
  if (context == nullptr) return;
  DestroyedList& l = list();
  const std::lock_guard<std::mutex> lock(l.mu);
  if (std::find(std::begin(l.ring), std::end(l.ring), context) != std::end(l.ring)) return;
  l.ring[l.next] = context;
  l.next = (l.next + 1) % kKept;
  l.any.store(true, std::memory_order_release);
}

void note_context_made(CUcontext context) {
  DestroyedList& l = list();
  if (context == nullptr || !l.any.load(std::memory_order_acquire)) return;
  const std::lock_guard<std::mutex> lock(l.mu);
  std::replace(std::begin(l.ring), std::end(l.ring), context, CUcontext{nullptr});
}

bool context_destroyed(CUcontext context) {
  DestroyedList& l = list();
  if (context == nullptr || !l.any.load(std::memory_order_acquire)) return false;
  const std::lock_guard<std::mutex> lock(l.mu);
  return std::find(std::begin(l.ring), std::end(l.ring), context) != std::end(l.ring);
}

}  // namespace gpushim
