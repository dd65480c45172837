#include "policy/vmm_pool.h"

#include <algorithm>

#include "policy/forwarding_backend.h"

namespace gpushim {

// The small pool's view of the device: its segments are arena blocks, everything else is the real
// backend. The small pool calls in while holding its own lock, and the arena never calls back,
// so the lock order is always small pool -> arena.
class VmmPool::SegmentSource final : public ForwardingBackend {
 public:
  SegmentSource(Backend& up, VmmArena& arena) : ForwardingBackend(up), arena_(arena) {}

  CUresult segment_alloc(size_t bytes, void** out) override {
    // A plain request: a segment may serve any stream. When the arena is short, the small pool
    // runs its own retry (sync, give back empty segments, try again), which passes through here.
    uint64_t got = 0;
    VmmArena::Attempt attempt;
    return arena_.try_allocate(bytes, AllocRequest{bytes, nullptr, false}, VmmArena::Owner::kSegment, out, &got,
                               &attempt);
  }
  // The small pool frees a segment only when all of it is idle (synchronized, or its events done).
  CUresult segment_free(void* p, size_t) override { return arena_.return_segment(p); }
  CUresult segment_extend(void* p, size_t, size_t more) override { return arena_.extend_segment(p, more); }
  CUresult segment_shrink(void* p, size_t, size_t keep) override { return arena_.shrink_segment(p, keep); }

  CUresult synchronize() override {
    // Refused while the pool only wants the small pool's idle empty segments back (see
    // VmmPool::reclaim_segments): CachingPool::release_cached then skips its sync and still
    // frees every empty segment that no queued work can touch.
    if (refuse_sync) return CUDA_ERROR_NOT_READY;
    const CUresult r = upstream().synchronize();
    // The same synchronization makes the arena's quarantine reusable too: no second one needed.
    if (r == CUDA_SUCCESS) arena_.settle_after_external_sync();
    return r;
  }
  // Per thread: only the reclaiming thread's own calls are refused.
  static thread_local bool refuse_sync;

 private:
  VmmArena& arena_;
};

thread_local bool VmmPool::SegmentSource::refuse_sync = false;

namespace {

CachingPoolOptions small_pool_options(const VmmPoolOptions& o, size_t granularity) {
  CachingPoolOptions c;
  c.round = o.round;
  c.small_max = o.small_max;
  c.small_segment = std::max<uint64_t>((o.small_segment + granularity - 1) / granularity * granularity, granularity);
  c.medium_max = std::max(o.medium_max, o.small_max);  // nothing larger ever reaches this pool
  c.large_segment = std::max<uint64_t>((o.medium_segment + granularity - 1) / granularity * granularity, c.medium_max);
  c.quarantine_bytes = o.quarantine_bytes;
  // Empty segments go back to the arena before this pool asks it for more: there their chunks
  // can serve either size class, or a large block, instead of staying stranded in one class.
  c.release_empty_before_growth = true;
  // Medium segments grow into the arena space after them and give back their free tails (see
  // CachingPoolOptions::grow_in_place_unit), one chunk at a time.
  c.grow_in_place_unit = granularity;
  return c;
}

}  // namespace

VmmPool::VmmPool(Backend& backend, VmmPoolOptions options)
    : opt_(options),
      arena_(backend, opt_),
      source_(std::make_unique<SegmentSource>(backend, arena_)),
      small_(std::make_unique<CachingPool>(*source_, small_pool_options(opt_, arena_.granularity()))) {}

VmmPool::~VmmPool() {
  small_.reset();  // returns its segments to the arena
  source_.reset();
}

void VmmPool::sync_all() { small_->release_cached(); }

void VmmPool::reclaim_segments() {
  SegmentSource::refuse_sync = true;
  small_->release_cached();
  SegmentSource::refuse_sync = false;
}

void VmmPool::reclaim_before_growth() {
  // Without waiting: what the device has finished with in the small pool becomes free, and its
  // empty segments go back to the arena, where their chunks can be stitched in.
  reclaim_segments();
}

CUresult VmmPool::allocate(const AllocRequest& req, void** out, uint64_t* allocated) {
  if (sub_allocated(req.size)) return small_->allocate(req, out, allocated);
  return allocate_large(req, out, allocated, nullptr);
}

CUresult VmmPool::allocate_large(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks* hooks) {
  // Before creating memory the arena reports what it would need; reclaiming happens here, outside
  // its lock, because it goes through the small pool, which calls into the arena. (The arena's
  // own quarantine syncs stay inside: they need not disturb the small pool's segments.)
  VmmArena::Attempt attempt;
  attempt.may_create = false;
  CUresult r = arena_.try_allocate(req.size, req, VmmArena::Owner::kUser, out, allocated, &attempt, hooks);
  if (r == CUDA_ERROR_NOT_READY && attempt.need == VmmArena::Need::kMemory) {
    reclaim_before_growth();
    attempt = {};
    r = arena_.try_allocate(req.size, req, VmmArena::Owner::kUser, out, allocated, &attempt, hooks);
  }
  if (r != CUDA_ERROR_OUT_OF_MEMORY) return r;
  // Short of memory, retry once after making every freed byte usable: one sync settles both parts
  // and returns the small pool's empty segments, whose chunks can then be stitched in.
  arena_.count_retry();
  sync_all();
  attempt = {};
  attempt.over_budget = true;
  r = arena_.try_allocate(req.size, req, VmmArena::Owner::kUser, out, allocated, &attempt, hooks);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) arena_.count_oom();
  return r;
}

CUresult VmmPool::allocate_with(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks& hooks) {
  if (sub_allocated(req.size)) return small_->allocate_with(req, out, allocated, hooks);
  return allocate_large(req, out, allocated, &hooks);
}

CUresult VmmPool::deallocate(void* p, CUstream stream, bool stream_ordered) {
  // The two address sets are disjoint: small blocks lie inside segments, which the arena never
  // lists as live user blocks.
  if (sub_allocating()) {
    const CUresult r = small_->deallocate(p, stream, stream_ordered);
    if (r != CUDA_ERROR_INVALID_VALUE) return r;
  }
  return arena_.deallocate(p, stream, stream_ordered);
}

CUresult VmmPool::deallocate_with(void* p, CUstream stream, bool stream_ordered, PayloadHooks& hooks) {
  if (sub_allocating()) {
    const CUresult r = small_->deallocate_with(p, stream, stream_ordered, hooks);
    if (r != CUDA_ERROR_NOT_FOUND) return r;
  }
  return arena_.deallocate(p, stream, stream_ordered, &hooks);
}

bool VmmPool::contains(const void* p) const { return arena_.contains(p); }

bool VmmPool::find_block(const void* p, uintptr_t* base, uint64_t* size) const {
  // Small blocks live inside sub-allocator segments, which the arena does not list as user blocks.
  return small_->find_block(p, base, size) || arena_.find_user_block(p, base, size);
}

const char* VmmPool::ipc_export_refusal(const void*, uint64_t) const {
  return "memory the vmm policy mapped with cuMemMap, which legacy CUDA IPC cannot share at all (a CUDA rule)";
}

void VmmPool::figures(PoolFigures* out) const {
  // Lock order small -> arena is respected: each figures() call takes one lock at a time.
  PoolFigures small;
  small_->figures(&small);
  uint64_t user_allocated = 0, segment_bytes = 0;
  arena_.figures(out, &user_allocated, &segment_bytes);
  // The small pool's segments are arena blocks; what it has handed out is allocated, the rest of
  // its segments is cached free like any free block.
  const uint64_t small_allocated = small.reserved_bytes - small.cached_free_bytes;
  const uint64_t allocated = user_allocated + std::min(small_allocated, segment_bytes);
  out->cached_free_bytes = out->reserved_bytes - std::min(out->reserved_bytes, allocated);
  out->quarantined_bytes += small.quarantined_bytes;
  out->largest_free_block = std::max(out->largest_free_block, small.largest_free_block);
  out->alloc_retries += small.alloc_retries;
  out->ooms += small.ooms;
  out->reuse_syncs += small.reuse_syncs;
  out->reuse_waits += small.reuse_waits;
  out->host_bytes += small.host_bytes + sizeof(VmmPool);
}

void VmmPool::release_cached() {
  sync_all();  // everything freed becomes idle; empty segments go back to the arena
  arena_.release_idle();
}

}  // namespace gpushim
