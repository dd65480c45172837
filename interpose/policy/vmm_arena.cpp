// The vmm arena's core (vmm_arena.h describes the whole): its blocks and the address index over
// them, best fit, allocation and free, reuse safety (what ReuseRules says about freed blocks),
// sub-allocator segments, and what the arena reports and checks of itself. The rest of the arena
// lives in one file per concern, each a part of the same class over the same state:
//   vmm_arena_planning.cpp   where a build goes and what fills its holes (no driver calls)
//   vmm_arena_mapping.cpp    carrying a plan out: virtual ranges, new and moved pieces, giving back
//   vmm_arena_lending.cpp    free chunk ends mapped a second time (VmmPoolOptions::alias_tails)
//   vmm_lifetimes.h          which sizes outlive troughs of live memory (VmmPoolOptions::long_fall)
// so that the hot path (allocation and free of a block that exists) reads apart from the rarer,
// longer work of making blocks by mapping.
#include "policy/vmm_arena.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace gpushim {

VmmArena::VmmArena(Backend& backend, const VmmPoolOptions& options)
    : backend_(backend),
      opt_(options),
      gran_(backend.granularity()),
      unit_(options.whole_chunks || options.round == 0 ? gran_ : std::min<uint64_t>(options.round, gran_)),
      rules_(backend, options.quarantine_bytes),
      lifetimes_(options.long_fall, options.long_rise) {}

VmmArena::~VmmArena() {
  // Only unit tests and the replay destroy a pool; the shim keeps its pools for the whole process.
  auto drop = [&](Block* b) {
    rules_.clear(b);
    delete b;
  };
  for (auto& [a, b] : blocks_)
    if (b->state == State::kLent || b->state == State::kShadow) drop(b);  // a lent wall keeps its free's event
  for (Block* b : free_) drop(b);
  rules_.for_each_waiting(drop);
  for (auto& [addr, b] : user_) drop(b);
  for (auto& [addr, b] : segments_) drop(b);
  for (auto& [va, p] : pieces_) backend_.unmap(va, p->size);
  for (auto& [va, p] : pieces_) {
    if (p->alias_of == nullptr) backend_.physical_release(p->handle, p->size);
    delete p;
  }
  for (Piece* p : loose_) {
    backend_.physical_release(p->handle, p->size);
    delete p;
  }
  for (auto& [base, r] : reservations_) {
    for (auto& [va, n] : r->parts) backend_.va_free(va, n);
    delete r;
  }
  for (Block* b : spare_) delete b;
}

VmmArena::Block* VmmArena::new_block() {
  if (spare_.empty()) return new Block;
  Block* b = spare_.back();
  spare_.pop_back();
  *b = Block{};
  return b;
}

void VmmArena::recycle(Block* b) {
  if (spare_.size() < kMaxSpareBlocks) {
    spare_.push_back(b);
    return;
  }
  delete b;
}

// ---------------------------------------------------------------------------------------------
// Allocation and free

CUresult VmmArena::try_allocate(uint64_t size, const AllocRequest& req, Owner owner, void** out, uint64_t* got,
                                Attempt* attempt, PayloadHooks* hooks) {
  if (gran_ == 0) return CUDA_ERROR_NOT_SUPPORTED;
  // Sub-allocator segments are whole chunks (they grow and shrink by chunks); user blocks are
  // multiples of unit_ (vmm_arena.h says why not whole chunks).
  const uint64_t want = round_up(std::max<uint64_t>(size, 1), owner == Owner::kSegment ? gran_ : unit_);
  // A size near 2^64 cannot be rounded (to the unit, or to the chunks a build would map), and
  // none above the 48-bit virtual address space of any GPU can be mapped: refused before a plan
  // counts chunks (or wraps addresses) for it.
  constexpr uint64_t kMaxBlock = 1ull << 48;
  if (want == 0 || want > kMaxBlock) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<FutexMutex> lock(mu_);
  // As in CachingPool: freed blocks the device is done with are reused before anything is carved.
  if (rules_.has_closed_epochs()) rules_.poll_closed([&](std::vector<Block*>& blocks) { release_waiting(blocks); });
  const uint8_t cls = class_of(want, owner);
  const Fit fit = fit_for(want, owner);
  // Rather than carve around blocks whose fence is still to complete (reuse_rules.h says why).
  // In the first step, not even for an exact fit (VmmPoolOptions::first_step_waits).
  const bool first_step = opt_.first_step_waits && !lifetimes_.seen_trough();
  if (opt_.wait_before_carve)
    rules_.wait_before_carving([&] { return !first_step && exact_fit_free(want, cls); },
                               [&](std::vector<Block*>& blocks) { release_waiting(blocks); });
  Block* b = find_free(want, cls, req, fit);
  // Freed memory whose fence has completed is reusable where it is: asked without waiting,
  // before anything is mapped.
  if (b == nullptr && rules_.waiting_bytes() > 0 && collect_locked()) b = find_free(want, cls, req, fit);
  // Rather than map new memory while memory freed with cudaFree still waits for the device, wait
  // for that work (the oldest epochs' fences, not the device): here any idle chunk can be stitched
  // into the new block, so every waiting byte is memory not created (the point of this policy).
  while (b == nullptr && rules_.waiting_bytes() > 0 &&
         rules_.wait_oldest([&](std::vector<Block*>& blocks) { release_waiting(blocks); }))
    b = find_free(want, cls, req, fit);
  CUresult err = CUDA_SUCCESS;
  if (b == nullptr) {
    alias_ok_ = owner == Owner::kUser && opt_.alias_tails;
    build_req_ = opt_.stream_order_builds ? &req : nullptr;
    b = build(want, cls, attempt, &err);
    build_req_ = nullptr;
    alias_ok_ = false;
  }
  if (b == nullptr) {
    if (err == CUDA_ERROR_NOT_READY) attempt->need = Need::kMemory;
    return err == CUDA_SUCCESS ? CUDA_ERROR_OUT_OF_MEMORY : err;
  }
  // Voted sizes from the top of the block (vmm_arena.h, long_fall), the rest from its bottom.
  b = split(b, want, fit == Fit::kHigh);
  // The block is live again; the free that ends this life will say when it may be reused. (An
  // event still attached here belongs to a free on the requesting stream, which orders after it.)
  rules_.clear(b);
  b->state = State::kAllocated;
  b->owner = owner;
  if (owner == Owner::kUser) {
    user_.emplace(b->addr, b);
    user_allocated_ += b->size;
    b->born = lifetimes_.allocated();
    b->born_live = user_allocated_;
    if (hooks != nullptr) hooks->on_allocated(b->addr, b->size, b->payload);
    else b->payload = BlockPayload{};  // nobody fills it: no stale record from an earlier life
  } else {
    segments_.emplace(b->addr, b);
    segment_bytes_ += b->size;
  }
  *out = reinterpret_cast<void*>(b->addr);
  *got = b->size;
  return CUDA_SUCCESS;
}

VmmArena::FreeSet::iterator VmmArena::first_fit(uint64_t size, uint8_t cls) {
  Reservation key_res;
  key_res.cls = cls;
  Block key;
  key.res = &key_res;
  key.size = size;
  return free_.lower_bound(&key);
}

bool VmmArena::exact_fit_free(uint64_t size, uint8_t cls) {
  const auto it = first_fit(size, cls);
  return it != free_.end() && (*it)->res->cls == cls && (*it)->size == size;
}

VmmArena::Block* VmmArena::find_free(uint64_t size, uint8_t cls, const AllocRequest& req, Fit fit) {
  // Blocks still in use by another stream are skipped; bound the scan so a long run of them
  // cannot make allocation linear in the number of free blocks.
  constexpr int kMaxScan = 64;
  int scanned = 0;
  auto found = free_.end();
  // Picking by address reads every candidate up to its bound, where best fit stops at the first
  // usable one: a tighter bound keeps that cheap (vmm_arena.h, long_fall, says what it costs).
  constexpr int kMaxPick = 16;
  const int limit = fit == Fit::kBest ? kMaxScan : kMaxPick;
  for (auto it = first_fit(size, cls); it != free_.end() && scanned < limit; ++it, ++scanned) {
    Block* b = *it;
    if (b->res->cls != cls) break;
    // The same bounded scan picks by address among the tightest fits (vmm_arena.h, long_fall).
    if (found != free_.end() && (fit == Fit::kHigh ? b->addr < (*found)->addr : b->addr > (*found)->addr)) continue;
    if (!rules_.usable(b, req)) continue;
    found = it;
    if (fit == Fit::kBest) break;
  }
  if (found == free_.end()) return nullptr;
  Block* b = *found;
  free_.erase(found);
  return b;
}

CUresult VmmArena::deallocate(void* p, CUstream stream, bool stream_ordered, PayloadHooks* hooks) {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = user_.find(reinterpret_cast<uintptr_t>(p));
  if (it == user_.end()) return hooks != nullptr ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_VALUE;
  Block* b = it->second;
  if (hooks != nullptr && !hooks->on_freeing(b->addr, b->size, b->payload)) return CUDA_ERROR_NOT_PERMITTED;
  user_.erase(it);
  // Learned while user_allocated_ still counts the block.
  lifetimes_.freed(b->born, b->born_live, b->size, user_allocated_);
  user_allocated_ -= b->size;
  b->state = State::kWaiting;
  b->home = nullptr;
  if (rules_.retire(b, stream, stream_ordered)) {
    b->home = b->stream;
    b->state = State::kFree;
    insert_free(coalesce(b));
  }
  return CUDA_SUCCESS;
}

CUresult VmmArena::return_segment(void* p) {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(p));
  if (it == segments_.end()) return CUDA_ERROR_INVALID_VALUE;
  Block* b = it->second;
  segments_.erase(it);
  segment_bytes_ -= b->size;
  b->state = State::kFree;
  insert_free(coalesce(b));
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Reuse safety

bool VmmArena::collect_locked() {
  return rules_.collect([&](std::vector<Block*>& blocks) { release_waiting(blocks); });
}

bool VmmArena::collect_idle() {
  std::lock_guard<FutexMutex> lock(mu_);
  return collect_locked();
}

void VmmArena::release_waiting(std::vector<Block*>& blocks) {
  // One at a time: a block still waiting (kWaiting) is never merged, one released earlier in the
  // list is already free and is.
  for (Block* b : blocks) insert_free(coalesce(b));
}

void VmmArena::settle_after_external_sync() {
  std::lock_guard<FutexMutex> lock(mu_);
  settle_locked();
}

void VmmArena::settle_locked() {
  // Everything freed before the synchronization is idle now: the waiting blocks, and free blocks
  // still tagged with a stream. Those are taken out first and re-inserted one at a time, so a
  // merge only ever swallows a block already re-inserted or one that was untagged all along.
  std::vector<Block*> tagged;
  for (auto it = free_.begin(); it != free_.end();) {
    // Blocks freed in another context's stream order wait for their own event: the
    // synchronization covered the pool's context only.
    if ((*it)->stream == nullptr || !rules_.synchronized_idle(*it)) {
      ++it;
      continue;
    }
    (*it)->state = State::kWaiting;
    rules_.clear(*it);
    tagged.push_back(*it);
    it = free_.erase(it);
  }
  rules_.settled_after_sync([&](std::vector<Block*>& blocks) { release_waiting(blocks); });
  release_waiting(tagged);
}

// ---------------------------------------------------------------------------------------------
// Blocks

VmmArena::Block* VmmArena::containing(uintptr_t va) const {
  auto it = blocks_.upper_bound(va);
  if (it == blocks_.begin()) return nullptr;
  --it;
  return va < it->first + it->second->size ? it->second : nullptr;
}

VmmArena::Block* VmmArena::before(const Block* b) const {
  auto it = blocks_.find(b->addr);
  if (it == blocks_.begin()) return nullptr;
  const Block* p = std::prev(it)->second;
  return p->res == b->res && p->addr + p->size == b->addr ? std::prev(it)->second : nullptr;
}

VmmArena::Block* VmmArena::after(const Block* b) const {
  auto it = blocks_.find(b->addr);
  if (++it == blocks_.end()) return nullptr;
  return it->second->res == b->res && it->first == b->addr + b->size ? it->second : nullptr;
}

VmmArena::Block* VmmArena::split(Block* b, uint64_t size, bool from_top) {
  if (b->size == size) return b;
  auto* r = new_block();
  r->size = b->size - size;
  r->res = b->res;
  share_terms(b, r);  // freed together with `b`
  if (from_top) {
    r->addr = b->addr;
    blocks_.erase(b->addr);
    b->addr += r->size;
    blocks_.emplace(b->addr, b);
  } else {
    r->addr = b->addr + size;
  }
  b->size = size;
  b->state = State::kAllocated;  // taken: the remainder must not merge back into it
  blocks_.emplace(r->addr, r);
  // The tail of a build's last page may touch a free block that was not part of the build.
  insert_free(coalesce(r));
  return b;
}

void VmmArena::insert_free(Block* b) {
  b->state = State::kFree;
  free_.insert(b);
}

VmmArena::Block* VmmArena::coalesce(Block* b) {
  // Neighbours merge only when reusing the merged block is as safe as reusing either part:
  // both ready for anyone, or both freed on the same stream (b's event, the newest, covers both),
  // or, with stream_order_builds, one idle and the other freed on the stream that freed the idle
  // one last (joins_home): the merged block takes the queued one's terms.
  // `b` is not in the free set (its key changes here); touching means no unmapped hole between.
  enum class Join : uint8_t { kNo, kSameTerms, kHome };
  auto join = [&](Block* n) {
    if (n == nullptr || n->state != State::kFree) return Join::kNo;
    if (rules_.mergeable_now(n, b)) return Join::kSameTerms;
    return joins_home(n, b) ? Join::kHome : Join::kNo;
  };
  // `keep` takes over `gone`'s bytes.
  auto take = [&](Block* keep, Block* gone, Join how) {
    if (how == Join::kSameTerms) {
      rules_.absorb(keep, gone);
      if (keep->home != gone->home) keep->home = nullptr;
      return;
    }
    if (keep->stream == nullptr) share_terms(gone, keep);  // the queued one's event covers both
    rules_.clear(gone);
  };
  if (Block* p = before(b); p != nullptr) {
    if (const Join how = join(p); how != Join::kNo) {
      free_.erase(p);
      take(b, p, how);
      blocks_.erase(b->addr);
      b->addr = p->addr;
      b->size += p->size;
      blocks_[b->addr] = b;  // takes over p's entry
      recycle(p);
    }
  }
  if (Block* n = after(b); n != nullptr) {
    if (const Join how = join(n); how != Join::kNo) {
      free_.erase(n);
      take(b, n, how);
      blocks_.erase(n->addr);
      b->size += n->size;
      recycle(n);
    }
  }
  return b;
}

bool VmmArena::joins_home(const Block* a, const Block* b) const {
  // An idle free block beside one freed on a stream whose work there is still queued stays apart
  // until that work is done (and after, until a free beside them merges them). Best fit then sees
  // two blocks where a request would fit their run, and carves a larger block elsewhere; on a
  // device running behind the host (replay --gpu-time model) most frees are still queued when
  // the next request comes, and single blocks stay split for whole steps. When the idle one's
  // memory was freed last by that same stream, they become one block on the queued one's terms:
  // reusable by that stream at once, by others once its work is done. The idle part was that
  // stream's, which reuses it in any case; other streams wait for memory they could have had at
  // once, so idle memory never freed on the stream (fresh, or another stream's) stays apart.
  // (CachingPool merges any idle neighbour so. Here that reserved about as much on the corpus,
  // but h200_transformer_caching made 50% more map calls, 5,474 vs 3,638, and another stream lost
  // the fresh rest of a chunk it could have had at once: VmmPool's unit tests.)
  // Measured under replay --gpu-time model (peak reserved MiB): with stream-ordered frees
  // transformer_train 50 -> 48, segmentation_train 166 -> 162, lstm_train 334 -> 338; the
  // GPU-recorded traces (stream-ordered as recorded) h200_transformer_vmm 2,258 -> 2,236,
  // h100_transformer_caching 2,310 -> 2,306, h200_steptime_caching 2,306 -> 2,304,
  // h200_transformer_caching 2,246 -> 2,248; the corpus's plain frees (no stream to join) and an
  // instant device (nothing stays queued) are unchanged.
  if (!opt_.stream_order_builds || (a->stream == nullptr) == (b->stream == nullptr)) return false;
  const Block* idle_one = a->stream == nullptr ? a : b;
  const Block* queued = a->stream == nullptr ? b : a;
  return idle_one->home != nullptr && same_stream(idle_one->home, queued->stream);
}

// ---------------------------------------------------------------------------------------------
// Sub-allocator segments

CUresult VmmArena::shrink_segment(void* p, uint64_t keep) {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(p));
  if (it == segments_.end()) return CUDA_ERROR_INVALID_VALUE;
  Block* seg = it->second;
  if (keep == 0 || keep % gran_ != 0 || keep >= seg->size) return CUDA_ERROR_NOT_SUPPORTED;
  auto* rest = new_block();
  rest->addr = seg->addr + keep;
  rest->size = seg->size - keep;
  rest->res = seg->res;
  seg->size = keep;
  segment_bytes_ -= rest->size;
  blocks_.emplace(rest->addr, rest);
  insert_free(coalesce(rest));
  return CUDA_SUCCESS;
}

CUresult VmmArena::extend_segment(void* p, uint64_t more) {
  if (gran_ == 0) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t add = round_up(more, gran_);
  if (add == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(p));
  if (it == segments_.end()) return CUDA_ERROR_INVALID_VALUE;
  Block* seg = it->second;
  Reservation* r = seg->res;
  const uintptr_t start = seg->addr + seg->size, end = start + add;
  if (end < start) return CUDA_ERROR_OUT_OF_MEMORY;
  // What lies after the segment: only holes and idle free blocks may be taken (a live block,
  // or one whose freeing work may still run, is a wall), inside the reservation or past its end.
  const uintptr_t inside_end = std::min<uintptr_t>(end, r->end);
  uint64_t covered = 0;
  for (auto b = blocks_.lower_bound(start); b != blocks_.end() && b->first < inside_end; ++b) {
    Block* n = b->second;
    if (n->state != State::kFree || !idle(n)) return CUDA_ERROR_NOT_SUPPORTED;
    covered += std::min<uintptr_t>(n->addr + n->size, inside_end) - n->addr;
  }
  if (end > r->end && !r->extendable) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t extend = end > r->end ? round_up(end, gran_) - r->end : 0;
  Plan plan{r->cls, r, start, (inside_end - start) - covered + extend, extend};
  Attempt attempt;
  CUresult err = CUDA_SUCCESS;
  bool replan = false;
  Block* b = build_at(plan, add, &attempt, &err, &replan);
  if (b == nullptr) return replan ? CUDA_ERROR_NOT_SUPPORTED : (err == CUDA_SUCCESS ? CUDA_ERROR_OUT_OF_MEMORY : err);
  // [start, end) is one idle free block now (sticking out past `end`, perhaps): the segment
  // takes it over.
  b = split(b, add);
  rules_.clear(b);
  blocks_.erase(b->addr);
  recycle(b);
  seg->size += add;
  segment_bytes_ += add;
  return CUDA_SUCCESS;
}

void VmmArena::count_retry() {
  std::lock_guard<FutexMutex> lock(mu_);
  ++retries_;
}

void VmmArena::count_oom() {
  std::lock_guard<FutexMutex> lock(mu_);
  ++ooms_;
}

// ---------------------------------------------------------------------------------------------
// Introspection

bool VmmArena::contains(const void* p) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = pieces_.upper_bound(a);
  if (it == pieces_.begin()) return false;
  --it;
  return a < it->first + it->second->size;
}

bool VmmArena::find_payload(const void* p, BlockPayload* out) const {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = user_.find(reinterpret_cast<uintptr_t>(p));
  if (it == user_.end()) return false;
  *out = it->second->payload;
  return true;
}

void VmmArena::live_user_blocks(std::vector<uintptr_t>* out) const {
  std::lock_guard<FutexMutex> lock(mu_);
  for (const auto& [a, b] : user_) out->push_back(a);
}

bool VmmArena::find_user_block(const void* p, uintptr_t* base, uint64_t* size) const {
  std::lock_guard<FutexMutex> lock(mu_);
  const Block* b = containing(reinterpret_cast<uintptr_t>(p));
  if (b == nullptr || b->state != State::kAllocated || b->owner != Owner::kUser) return false;
  *base = b->addr;
  *size = b->size;
  return true;
}

void VmmArena::figures(PoolFigures* out, uint64_t* user_allocated, uint64_t* segment_bytes) const {
  std::lock_guard<FutexMutex> lock(mu_);
  out->reserved_bytes = held_;
  out->peak_reserved_bytes = peak_held_;
  out->cached_free_bytes = held_ - user_allocated_ - segment_bytes_;
  out->quarantined_bytes = rules_.waiting_bytes();
  out->largest_free_block = 0;
  // The largest of each class: the last block of the set, and the last one before class 1.
  if (!free_.empty()) {
    out->largest_free_block = (*free_.rbegin())->size;
    Reservation key_res;
    key_res.cls = 1;
    Block key;
    key.res = &key_res;
    auto it = free_.lower_bound(&key);
    if (it != free_.begin()) out->largest_free_block = std::max(out->largest_free_block, (*std::prev(it))->size);
  }
  out->segment_allocs = creates_;
  out->segment_frees = releases_;
  out->alloc_retries = retries_;
  out->ooms = ooms_;
  out->reuse_syncs = rules_.syncs();
  out->reuse_waits = rules_.waits();
  out->map_calls = maps_;
  out->unmap_calls = unmaps_;
  out->mapped_bytes = mapped_;
  // The shim's own host memory for this arena (it is reported per live allocation): blocks and
  // pieces are heap nodes indexed by ordered maps, free blocks also sit in a set, live ones in
  // hash maps. Same estimate as CachingPool's.
  constexpr uint64_t kHeapOverhead = 16;
  constexpr uint64_t kTreeNode = 4 * sizeof(void*) + 2 * sizeof(uintptr_t) + kHeapOverhead;
  constexpr uint64_t kHashSlot = sizeof(uintptr_t) + sizeof(Block*) + 1;
  uint64_t reservation_bytes = 0;
  for (const auto& [base, r] : reservations_)
    reservation_bytes += sizeof(Reservation) + kHeapOverhead + kTreeNode + r->parts.capacity() * sizeof(r->parts[0]);
  out->host_bytes = blocks_.size() * (sizeof(Block) + kHeapOverhead + kTreeNode) + free_.size() * kTreeNode +
                    rules_.waiting_capacity() * sizeof(Block*) + (user_.capacity() + segments_.capacity()) * kHashSlot +
                    pieces_.size() * (sizeof(Piece) + kHeapOverhead + kTreeNode) + reservation_bytes +
                    loose_.capacity() * sizeof(Piece*) + spare_.capacity() * sizeof(Block*) +
                    spare_.size() * (sizeof(Block) + kHeapOverhead) + lifetimes_.host_bytes();
  *user_allocated = user_allocated_;
  *segment_bytes = segment_bytes_;
}

VmmStats VmmArena::stats() const {
  std::lock_guard<FutexMutex> lock(mu_);
  VmmStats s = stats_;
  s.pieces = pieces_.size() + loose_.size();
  s.reservations = reservations_.size();
  return s;
}

std::string VmmArena::check_invariants() const {
  std::lock_guard<FutexMutex> lock(mu_);
  uint64_t quarantined = 0, user = 0, segments = 0;
  size_t listed = free_.size() + rules_.waiting_blocks() + user_.size() + segments_.size();
  for (const auto& [a, b] : blocks_) listed += b->state == State::kLent || b->state == State::kShadow;
  for (const Piece* p : aliases_) {
    if (p->alias_of == nullptr || p->lent == nullptr || pieces_.count(p->va) == 0) return "alias bookkeeping";
    if (p->lent->state != State::kLent) return "alias walls";
    const uint64_t off = p->lent->addr - p->alias_of->va;
    if (p->shadow == nullptr) {  // a whole chunk lent (borrow)
      if (off != 0 || p->lent->size != p->size) return "a shadowless alias lends less than its chunk";
      continue;
    }
    if (p->shadow->state != State::kShadow) return "alias walls";
    if (p->lent->size + p->shadow->size != p->size || p->shadow->addr != (off == 0 ? p->va + p->lent->size : p->va) ||
        (off != 0 && off + p->lent->size != p->size))
      return "lent part and shadow disagree";
  }
  for (const Block* b : free_)
    if (b->state != State::kFree) return "a block in the free set is not free";
  bool bad_waiting = false;
  rules_.for_each_waiting([&](const Block* b) {
    bad_waiting |= b->state != State::kWaiting || b->stream != nullptr;
    quarantined += b->size;
  });
  if (bad_waiting) return "a waiting block has the wrong state or a stream";
  for (const auto& [a, b] : user_) {
    if (b->state != State::kAllocated || b->owner != Owner::kUser || a != b->addr) return "bad live block";
    user += b->size;
  }
  for (const auto& [a, b] : segments_) {
    if (b->state != State::kAllocated || b->owner != Owner::kSegment || a != b->addr) return "bad segment block";
    segments += b->size;
  }
  if (quarantined != rules_.waiting_bytes()) return "waiting bytes disagree";
  if (user != user_allocated_ || segments != segment_bytes_) return "allocated bytes disagree";
  if (listed != blocks_.size()) return "the address index and the block lists disagree";
  // Blocks: disjoint, whole chunks, inside their reservation.
  const Block* prev = nullptr;
  for (const auto& [a, b] : blocks_) {
    if (a != b->addr) return "address index key";
    if (b->state == State::kFree && free_.count(const_cast<Block*>(b)) == 0) return "a free block missing from the free set";
    const uint64_t unit = b->owner == Owner::kSegment && b->state == State::kAllocated ? gran_ : unit_;
    if (b->size == 0 || b->size % unit || b->addr % unit_) return "block not made of whole units";
    if (b->res == nullptr || reservations_.count(b->res->base) == 0) return "block in an unknown reservation";
    if (b->addr < b->res->base || b->addr + b->size > b->res->end) return "block outside its reservation";
    if (prev && prev->addr + prev->size > b->addr) return "blocks overlap";
    prev = b;
  }
  // Blocks tile the mapped pieces exactly: compare the two unions, interval by interval.
  auto merged = [](const std::vector<std::pair<uintptr_t, uintptr_t>>& v) {
    std::vector<std::pair<uintptr_t, uintptr_t>> out;
    for (const auto& iv : v) {
      if (!out.empty() && out.back().second == iv.first) out.back().second = iv.second;
      else out.push_back(iv);
    }
    return out;
  };
  std::vector<std::pair<uintptr_t, uintptr_t>> bi, pi;
  for (const auto& [a, b] : blocks_) bi.emplace_back(a, a + b->size);
  uint64_t mapped = 0;
  std::map<const Reservation*, uint64_t> counts;
  for (const auto& [va, p] : pieces_) {
    if (p->va != va || p->res == nullptr) return "piece bookkeeping";
    if (va < p->res->base || va + p->size > p->res->end) return "piece outside its reservation";
    for (const auto& [part, n] : p->res->parts)
      if (va < part + n && part < va + p->size && (va < part || va + p->size > part + n)) return "piece spans two driver reservations";
    if (!pi.empty() && pi.back().second > va) return "pieces overlap";
    pi.emplace_back(va, va + p->size);
    mapped += p->size;
    ++counts[p->res];
  }
  if (merged(bi) != merged(pi)) return "blocks do not tile the mapped pieces";
  if (mapped != mapped_) return "mapped bytes disagree";
  uint64_t loose = 0;
  for (const Piece* p : loose_) loose += p->size;
  if (mapped - alias_bytes_ + loose != held_) return "held bytes disagree with the pieces";
  for (const auto& [base, r] : reservations_) {
    if (r->pieces != counts[r] || r->pieces == 0) return "reservation piece count (or an empty reservation kept)";
    uintptr_t end = r->base;
    for (const auto& [part, n] : r->parts) {
      if (part != end) return "reservation parts not contiguous";
      end += n;
    }
    if (end != r->end) return "reservation parts do not add up";
  }
  return "";
}

}  // namespace gpushim
