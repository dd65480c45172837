// GPUSHIM_POLICY=vmm: a pool without external fragmentation, built on the driver's virtual-memory
// API (cuMemCreate / cuMemAddressReserve / cuMemMap). The caching policy can hold far more than
// is allocated when freed memory is scattered in pieces too small for the next request; here free
// physical memory is remapped, wherever it sits, into one contiguous range (vmm_arena.h), so the
// pool grows only by what free memory cannot cover.
//
// By default every request is a block of the VmmArena, 512 B rounded and packed so that
// neighbours share chunks (vmm_arena.h). Optionally (VmmPoolOptions::small_max, medium_max), two
// parts, composed:
//   - requests above `medium_max` are blocks of the VmmArena;
//   - smaller ones are sub-allocated by a CachingPool (small requests from 4 MiB segments, medium
//     ones from 8 MiB segments), whose segments are themselves arena blocks (SegmentSource, a
//     Backend adaptor): small requests share chunks and follow the caching policy's reuse rules,
//     and empty segments go back to the arena, where their chunks can be remapped. A medium
//     segment whose free tail falls short grows in place (VmmArena::extend_segment), and before
//     the small pool grows it hands back empty segments and its free tails' whole chunks
//     (VmmArena::shrink_segment): the expandable-segments idea, over the arena's chunks.
// Reuse safety is the caching policy's (reuse_rules.h, in both parts): cudaFree'd memory waits for
// a device fence queried without waiting, stream-ordered frees are reusable at once on their
// stream and elsewhere once their event completes, and nothing is synchronized, queried or
// unmapped during stream capture. Before the pool creates memory, the small pool hands back, without
// waiting, its empty idle segments; only on the out-of-memory retry does one sync through the small
// pool (sync_all) settle both parts.
//
// Memory mapped with cuMemMap cannot be exported with cudaIpcGetMemHandle (a CUDA rule): is_vmm()
// lets the core refuse it with a clear message instead of handing out a handle that fails later.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>

#include "policy/backend.h"
#include "policy/caching_pool.h"
#include "policy/device_memory_resource.h"
#include "policy/vmm_arena.h"

namespace gpushim {

class VmmPool final : public DeviceMemoryResource {
 public:
  // `backend.granularity()` must be non-zero (the device supports virtual memory management).
  VmmPool(Backend& backend, VmmPoolOptions options);
  ~VmmPool() override;

  CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) override;
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered) override;
  bool contains(const void* p) const override;
  bool find_block(const void* p, uintptr_t* base, uint64_t* size) const override;
  const char* ipc_export_refusal(const void* block, uint64_t size) const override;
  void figures(PoolFigures* out) const override;
  void release_cached() override;
  void forget_streams(absl::FunctionRef<bool(CUstream)> doomed) override {
    small_->forget_streams(doomed);
    arena_.forget_streams(doomed);
  }
  // Every block carries the caller's payload (its allocation record), in the small pool or in
  // the arena: one lock and one lookup per call instead of a separate record table.
  bool holds_payloads() const override { return true; }
  CUresult allocate_with(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks& hooks) override;
  CUresult deallocate_with(void* p, CUstream stream, bool stream_ordered, PayloadHooks& hooks) override;
  bool find_payload(const void* p, BlockPayload* out) const override {
    return (sub_allocating() && small_->find_payload(p, out)) || arena_.find_payload(p, out);
  }
  void live_payload_blocks(std::vector<uintptr_t>* out) const override {
    small_->live_payload_blocks(out);
    arena_.live_user_blocks(out);
  }
  // Both locks, in the order small pool -> arena.
  void with_lock(absl::FunctionRef<void()> fn) const override {
    small_->with_lock([&] { arena_.with_lock(fn); });
  }

  // All memory of this pool is mapped with cuMemMap, which legacy IPC cannot share.
  bool is_vmm() const { return true; }

  const VmmPoolOptions& options() const { return opt_; }
  VmmStats stats() const { return arena_.stats(); }
  // "" when every structural invariant of the arena holds, else the first violation (tests).
  std::string check_invariants() const { return arena_.check_invariants(); }

 private:
  class SegmentSource;
  bool sub_allocating() const { return opt_.small_max > 0 || opt_.medium_max > 0; }
  bool sub_allocated(uint64_t size) const {
    const uint64_t max = std::max(opt_.small_max, opt_.medium_max);
    return max > 0 && size <= max;
  }
  CUresult allocate_large(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks* hooks);
  // One device synchronization that settles both parts: the small pool's, which passes through
  // SegmentSource and so settles the arena too, and which hands every empty segment back.
  void sync_all();
  // Hands the small pool's idle empty segments back to the arena, without synchronizing.
  void reclaim_segments();
  // Before the arena creates memory: take back the small pool's idle empty segments.
  void reclaim_before_growth();

  const VmmPoolOptions opt_;
  VmmArena arena_;
  // Destroyed before the arena: the small pool hands its segments back on destruction.
  std::unique_ptr<SegmentSource> source_;
  std::unique_ptr<CachingPool> small_;
};

}  // namespace gpushim
