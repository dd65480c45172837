// GPUSHIM_POLICY=caching: a best-fit pool of blocks carved from driver segments (the design
// PyTorch's CUDACachingAllocator made familiar). Reuse follows CUDA's rules as stated once in
// reuse_rules.h: a cudaFree'd block waits for a device fence (events on every stream in use,
// recorded once for a whole epoch of frees and queried without waiting), a cudaFreeAsync'd block
// is reusable at once on its stream, and the device is synchronized only when memory is short.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "policy/reuse_rules.h"
#include "util/futex_mutex.h"

namespace gpushim {

struct CachingPoolOptions {
  uint64_t round = 512;                     // every block is a multiple of this
  uint64_t small_max = 1ull << 20;          // requests up to this come from small segments
  uint64_t small_segment = 2ull << 20;
  uint64_t medium_max = 10ull << 20;        // requests up to this come from large segments
  uint64_t large_segment = 20ull << 20;
  uint64_t huge_round = 2ull << 20;         // larger requests get a segment of their own, this rounded
  uint64_t max_split = UINT64_MAX;          // blocks this large are never split for smaller requests
  // cudaFree'd bytes gathered into one epoch before its fence is recorded (GPUSHIM_QUARANTINE):
  // larger epochs record fewer events, smaller ones let freed memory become reusable sooner. On
  // the trace corpus 64 KiB-1 MiB reserve what PyTorch's allocator does (8 MiB: up to 40% more);
  // 256 KiB is one fence per 64 frees of 4 KiB.
  uint64_t quarantine_bytes = 256ull << 10;
  // Before growing, hand back every empty segment the device is done with (no waiting). Off for
  // the caching policy, whose segments go straight to the driver; the vmm policy's sub-allocator
  // turns it on: its segments go back to the arena, which can stitch their chunks into the one
  // it is asked for next, so a segment emptied in one size class does not stay stranded there.
  bool release_empty_before_growth = false;
  // Segments that grow and shrink in place, by whole units of this size (0: never; the caching
  // policy: cudaMalloc'd segments cannot). Before a medium request makes a new segment, a medium
  // segment ending in a free idle block grows by what that block lacks (Backend::segment_extend),
  // as PyTorch's expandable segments grow into unmapped space; with release_empty_before_growth,
  // the whole units of every segment's free idle tail go back too (Backend::segment_shrink), since
  // a segment that grew rarely empties as a whole.
  uint64_t grow_in_place_unit = 0;
};

class CachingPool final : public DeviceMemoryResource {
 public:
  CachingPool(Backend& backend, CachingPoolOptions options);
  ~CachingPool() override;

  CUresult allocate(const AllocRequest& req, void** out, uint64_t* allocated) override;
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered) override;
  bool contains(const void* p) const override;
  void figures(PoolFigures* out) const override;
  void release_cached() override;
  void release_before_reset() override;
  void trim_to(uint64_t keep) override;
  void forget_streams(absl::FunctionRef<bool(CUstream)> doomed) override;
  bool find_block(const void* p, uintptr_t* base, uint64_t* size) const override;
  const char* ipc_export_refusal(const void* block, uint64_t size) const override;
  bool holds_payloads() const override { return true; }
  bool places_blocks() const override { return true; }
  uint64_t max_split() const override { return opt_.max_split; }
  CUresult allocate_with(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks& hooks) override;
  CUresult deallocate_with(void* p, CUstream stream, bool stream_ordered, PayloadHooks& hooks) override;
  bool find_payload(const void* p, BlockPayload* out) const override;
  void live_payload_blocks(std::vector<uintptr_t>* out) const override;
  void with_lock(absl::FunctionRef<void()> fn) const override;

  const CachingPoolOptions& options() const { return opt_; }
  // Block size a request of `size` bytes is rounded to (before any splitting decision).
  uint64_t rounded_size(uint64_t size) const;

 private:
  // kWaiting: freed, held by the reuse rules until its fence completes; kReleasing: just released
  // by them (or by a synchronization), about to be merged with its neighbours in one pass.
  // kSpare: recycled (apart_ may still name it).
  enum class State : uint8_t { kAllocated, kFree, kWaiting, kReleasing, kMerged, kSpare };
  struct Segment;
  struct Block {
    uintptr_t addr = 0;
    uint64_t size = 0;
    Segment* segment = nullptr;
    Block* prev = nullptr;  // address-order neighbours inside the segment
    Block* next = nullptr;
    State state = State::kFree;
    bool listed_apart = false;   // in apart_ (never deleted while so; recycled: kSpare)
    CUstream stream = nullptr;   // for stream-ordered frees: the stream it was freed on
    ReuseEvent* event = nullptr; // completes when work before that free is done; recorded lazily
    BlockPayload payload;       // the caller's, while allocated through allocate_with
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->addr < b->addr;
    }
  };
  // A B-tree rather than std::set: one node holds many blocks, so inserts and erases rarely
  // allocate and lookups touch few cache lines (the free sets are on every allocation's path).
  using FreeSet = absl::btree_set<Block*, BySizeThenAddress>;
  struct Segment {
    uintptr_t base = 0;
    uint64_t size = 0;
    bool small = false;
    uint32_t live = 0;      // blocks handed out
    Block* head = nullptr;  // the block at `base`: the start of the address-ordered list
  };
  // Where an allocated block lies in its segment (for the hooks: BlockPlace).
  static BlockPlace place_of(const Block* b) {
    return BlockPlace{b->segment->size, b->segment->live == 1, b->prev != nullptr && b->prev->state != State::kAllocated,
                      b->next != nullptr && b->next->state != State::kAllocated};
  }

  // allocate() and allocate_with(): without hooks the payload is cleared.
  CUresult allocate_block(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks* hooks);
  // deallocate() and deallocate_with(): CUDA_ERROR_NOT_FOUND when `p` starts no live block,
  // CUDA_ERROR_NOT_PERMITTED when the hooks refused (nothing happened either way).
  CUresult deallocate_block(void* p, CUstream stream, bool stream_ordered, PayloadHooks* hooks);
  // allocate/deallocate with mu_ held.
  CUresult allocate_locked(const AllocRequest& req, Block** out);
  void deallocate_locked(Block* b, CUstream stream, bool stream_ordered);

  FreeSet& free_set(bool small) { return small ? small_free_ : large_free_; }
  uint64_t segment_size_for(uint64_t rounded) const;
  Block* find_free(uint64_t size, bool small, const AllocRequest& req);
  // The first block of `set` at least `size` large, or end(): a B-tree descent, skipped when the
  // last one answered the same question and the set has not changed since (hint_).
  FreeSet::iterator first_fit_candidate(FreeSet& set, uint64_t size);
  // Does a free block of exactly `size` bytes exist (usable or not)? Sets hint_ as find_free will use it.
  bool exact_fit_free(uint64_t size, bool small);
  Block* grow(uint64_t size, bool small, CUresult* err);
  // grow()'s first try for a medium request with grow_in_place_unit: extends a medium segment
  // whose free idle tail then serves it; null when none can be.
  Block* grow_in_place(uint64_t size);
  Block* split(Block* b, uint64_t size, bool small);
  bool worth_splitting(const Block* b, uint64_t size, bool small) const;
  // Takes `size` bytes from the free block at `it` (usable for the request): the block itself,
  // out of the set, or its front when it is worth splitting.
  Block* take(FreeSet& set, FreeSet::iterator it, uint64_t size, bool small);
  void insert_free(Block* b);
  // Every removal from a free set goes through here, so that free_version_ follows it
  // (`what`: an iterator, or the block itself).
  template <typename What>
  void erase_free(FreeSet& set, What what) {
    set.erase(what);
    ++free_version_;
  }
  // Merges the free block `b` (in no free set) with its free neighbours where the reuse rules
  // allow, and puts the result in its free set.
  void coalesce_into_free(Block* b);
  // Blocks handed back by the reuse rules (state kWaiting): merged with each other and with free
  // neighbours, then inserted. With `all_idle` (after a synchronization) every free block is
  // idle too: the free sets are emptied into the same pass, so each run becomes one block.
  void release_batch(std::vector<Block*>& blocks, bool all_idle);
  // Free blocks freed on a stream that coalesce_into_free() left apart from a free neighbour:
  // those whose stream has finished with them (asked without waiting, one event per stream) are
  // merged. True if any was.
  bool settle_unmerged();
  // The same for the blocks listed in apart_ only, every kSettleBatch stream-ordered frees while
  // any is listed: merging keeps pace with the frees at one event per stream per batch, so best
  // fit sees merged blocks much as it did when they merged at the free.
  bool settle_apart();
  void release_cached_locked();
  void note_apart(Block* b);
  bool collect_idle();        // non-blocking: releases blocks whose fence has completed
  bool sync_and_release();    // false if a capture forbids it
  // Stops once less than `keep` bytes are reserved (0: frees every empty segment).
  void free_empty_segments(uint64_t keep = 0);
  // With grow_in_place_unit: gives back the whole units in every segment's free idle tail.
  void trim_free_tails();
  // Blocks are recycled: a split or merge on every allocation must not cost a heap allocation.
  Block* new_block();
  void recycle(Block* b);

  Backend& backend_;
  const CachingPoolOptions opt_;
  mutable FutexMutex mu_;
  FreeSet small_free_, large_free_;
  // Bumped whenever a block enters or leaves a free set: B-tree iterators are valid until then.
  uint64_t free_version_ = 0;
  // An allocation loop asks for the same size over and over; the answer is kept while valid.
  struct FindHint {
    const FreeSet* set = nullptr;
    FreeSet::iterator it;
    uint64_t version = 0;
    uint64_t size = 0;
  } hint_;
  ReuseRules<Block> rules_;
  std::vector<Block*> spare_blocks_;
  static constexpr uint64_t kMinSpareBlocks = 4096;
  uint64_t blocks_ = 0, peak_blocks_ = 0;  // blocks in use (not spare), and their most
  absl::flat_hash_map<uintptr_t, Block*> allocated_;
  std::map<uintptr_t, Segment*> segments_;  // by base, for contains() and release
  uint64_t reserved_ = 0, peak_reserved_ = 0, allocated_bytes_ = 0;
  uint64_t segment_allocs_ = 0, segment_frees_ = 0, retries_ = 0, ooms_ = 0;
  uint64_t segment_grows_ = 0;  // segments grown in place (grow_in_place_unit)
  bool unmerged_ = false;  // blocks may have been left apart that settle_unmerged would merge
  // Set by release_before_reset: its synchronization releases blocks freed in another context's
  // stream order too (the reset frees their memory anyway).
  bool sync_releases_everything_ = false;
  std::vector<Block*> apart_;  // tagged free blocks left apart at a free (may have changed since)
  static constexpr uint32_t kSettleBatch = 64;
  uint32_t frees_since_settle_ = 0;
};

}  // namespace gpushim
