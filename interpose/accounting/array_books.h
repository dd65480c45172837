// CUDA arrays (cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate; cudaMallocArray and its kin
// reach them through the driver): device memory behind an opaque handle, which only CUDA can serve
// and only cuArrayDestroy / cuMipmappedArrayDestroy free. Their records are in the
// AllocationTracker like every other allocation's, under key_of(handle). What no driver call tells
// afterwards is kept here: each array's context, since cuCtxDestroy frees the arrays made in it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace gpushim {

class ArrayBooks {
 public:
  // Handles are the driver's host pointers, below 2^57 in any user space: keyed with bit 62 (arrays)
  // or bit 61 (mipmapped arrays) set they meet no address a program is handed, and no VmmTracker
  // key (bit 63).
  static uintptr_t key_of(CUarray a) { return reinterpret_cast<uintptr_t>(a) | kArrayBit; }
  static uintptr_t key_of(CUmipmappedArray m) { return reinterpret_cast<uintptr_t>(m) | kMipmappedBit; }
  static uintptr_t handle_of(uintptr_t key) { return key & ~(kArrayBit | kMipmappedBit); }
  static bool is_key(uintptr_t k) { return (k >> 61) == (kArrayBit >> 61) || (k >> 61) == (kMipmappedBit >> 61); }

  void created(uintptr_t key, CUcontext ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    contexts_[key] = ctx;
  }
  void destroyed(uintptr_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    contexts_.erase(key);
  }
  // Before a destroy is forwarded: once CUDA lets go of the handle, a create on another thread may
  // be handed it, and its entry must not be the one erased. Returns the context (null if none), for
  // put_back should the destroy fail.
  CUcontext take(uintptr_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = contexts_.find(key);
    if (it == contexts_.end()) return nullptr;
    const CUcontext ctx = it->second;
    contexts_.erase(it);
    return ctx;
  }
  void put_back(uintptr_t key, CUcontext ctx) {
    if (ctx == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    contexts_.try_emplace(key, ctx);
  }
  // The keys of the arrays made in `ctx` and not destroyed since (a device reset may have freed some:
  // the caller checks its books).
  std::vector<uintptr_t> of_context(CUcontext ctx) const {
    std::vector<uintptr_t> keys;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, owner] : contexts_)
      if (owner == ctx) keys.push_back(key);
    return keys;
  }

 private:
  static constexpr uintptr_t kArrayBit = uintptr_t{1} << 62;
  static constexpr uintptr_t kMipmappedBit = uintptr_t{1} << 61;
  mutable std::mutex mu_;
  absl::flat_hash_map<uintptr_t, CUcontext> contexts_;
};

}  // namespace gpushim
