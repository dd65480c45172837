#include "policy/caching_pool.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

namespace gpushim {

namespace {

uint64_t round_up(uint64_t v, uint64_t m) { return v > UINT64_MAX - (m - 1) ? 0 : (v + m - 1) / m * m; }

}  // namespace

CachingPool::CachingPool(Backend& backend, CachingPoolOptions options)
    : backend_(backend), opt_(options), rules_(backend, options.quarantine_bytes) {}

CachingPool::~CachingPool() {
  // Only unit tests and the replay destroy a pool; the shim keeps its pools for the whole process.
  for (auto& [base, seg] : segments_) {
    backend_.segment_free(reinterpret_cast<void*>(base), seg->size);
    delete seg;
  }
  auto delete_list = [&](Block* b) {
    rules_.clear(b);
    delete b;
  };
  for (Block* b : small_free_) delete_list(b);
  for (Block* b : large_free_) delete_list(b);
  rules_.for_each_waiting(delete_list);
  for (auto& [addr, b] : allocated_) delete_list(b);
  for (Block* b : spare_blocks_) delete b;
}

CachingPool::Block* CachingPool::new_block() {
  peak_blocks_ = std::max(peak_blocks_, ++blocks_);
  if (spare_blocks_.empty()) return new Block;
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  // Every field but the payload, which allocate_with fills before anyone reads it: clearing its
  // 40 bytes on every split was a visible share of the alloc+free pair.
  b->addr = 0;
  b->size = 0;
  b->segment = nullptr;
  b->prev = b->next = nullptr;
  b->state = State::kFree;
  b->stream = nullptr;
  b->event = nullptr;
  return b;
}

void CachingPool::recycle(Block* b) {
  --blocks_;
  b->state = State::kSpare;  // apart_ may still name it
  if (b->listed_apart) {
    spare_blocks_.push_back(b);
    return;
  }
  // Bounded so that a burst of splits does not pin memory forever, but by the most blocks the
  // pool ever had, not a constant: a settle merges a whole quarantine (thousands of splits) back
  // at once, and the same number of splits follows; below that, half of them would go to malloc.
  if (spare_blocks_.size() < std::max<uint64_t>(kMinSpareBlocks, peak_blocks_)) spare_blocks_.push_back(b);
  else delete b;
}

uint64_t CachingPool::rounded_size(uint64_t size) const { return round_up(std::max<uint64_t>(size, 1), opt_.round); }

uint64_t CachingPool::segment_size_for(uint64_t rounded) const {
  if (rounded <= opt_.small_max) return opt_.small_segment;
  if (rounded <= opt_.medium_max) return opt_.large_segment;
  return round_up(rounded, opt_.huge_round);
}

CUresult CachingPool::allocate(const AllocRequest& req, void** out, uint64_t* allocated) {
  return allocate_block(req, out, allocated, nullptr);
}

CUresult CachingPool::allocate_with(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks& hooks) {
  return allocate_block(req, out, allocated, &hooks);
}

CUresult CachingPool::allocate_block(const AllocRequest& req, void** out, uint64_t* allocated, PayloadHooks* hooks) {
  std::lock_guard<FutexMutex> lock(mu_);
  Block* b = nullptr;
  const CUresult r = allocate_locked(req, &b);
  if (r != CUDA_SUCCESS) return r;
  if (hooks != nullptr) {
    const BlockPlace place = place_of(b);
    hooks->on_allocated(b->addr, b->size, b->payload, &place);
  } else b->payload = BlockPayload{};  // nobody fills it (new_block leaves it as it was)
  *out = reinterpret_cast<void*>(b->addr);
  *allocated = b->size;
  return CUDA_SUCCESS;
}

CUresult CachingPool::allocate_locked(const AllocRequest& req, Block** out) {
  const uint64_t size = rounded_size(req.size);
  if (size == 0) return CUDA_ERROR_OUT_OF_MEMORY;  // a size near 2^64 cannot be rounded
  const bool small = size <= opt_.small_max;
  // Freed blocks are best reused as soon as the device is done with them, before best fit carves
  // new space for their size (measured on the trace corpus: an epoch that waits for the next miss
  // holds up to 40% more memory). While a closed epoch waits, that is one query per allocation.
  if (rules_.has_closed_epochs()) rules_.poll_closed([&](std::vector<Block*>& blocks) { release_batch(blocks, false); });
  // Rather than carve around blocks whose fence is still to complete (reuse_rules.h says why).
  rules_.wait_before_carving([&] { return exact_fit_free(size, small); },
                             [&](std::vector<Block*>& blocks) { release_batch(blocks, false); });
  Block* b = find_free(size, small, req);
  // Freed memory whose fence has completed is reusable: asked without waiting, before growing.
  if (b == nullptr && rules_.waiting_bytes() > 0 && collect_idle()) b = find_free(size, small, req);
  // Freed memory enough for the request is still in use by the device: wait for the oldest
  // epoch rather than grow (the host is ahead of the device; growing would not stop).
  while (b == nullptr && rules_.waiting_bytes() >= size &&
         rules_.wait_oldest([&](std::vector<Block*>& blocks) { release_batch(blocks, false); }))
    b = find_free(size, small, req);
  // Blocks freed on a stream next to free blocks they could not merge with at the free: merged
  // now if their stream has finished with them, before anything grows.
  if (b == nullptr && settle_unmerged()) b = find_free(size, small, req);
  CUresult err = CUDA_SUCCESS;
  if (b == nullptr && opt_.release_empty_before_growth) {
    free_empty_segments();
    // And the whole chunks of grown segments' free tails: one trimmed to a chunk boundary can
    // still grow below (the arena hands the same chunks back unmoved if nothing took them), and
    // measured on the corpus this order holds less than trimming only when growing fails.
    if (opt_.grow_in_place_unit != 0) trim_free_tails();
  }
  if (b == nullptr) b = grow(size, small, &err);
  if (b == nullptr && err == CUDA_ERROR_OUT_OF_MEMORY) {
    // Short of memory: the one place the pool waits for the device. Make everything freed
    // reusable, give every empty segment back, retry once.
    ++retries_;
    if (sync_and_release()) b = find_free(size, small, req);
    if (b == nullptr) {
      free_empty_segments();
      b = grow(size, small, &err);
    }
  }
  if (b == nullptr) {
    ++ooms_;
    return err == CUDA_SUCCESS ? CUDA_ERROR_OUT_OF_MEMORY : err;
  }
  b = split(b, size, small);  // a fresh segment; free blocks were taken to size by find_free
  // A block reused at once on its own stream still carries that stream and possibly an event
  // recorded for an earlier free. An allocated block carries neither: left there, the stale event
  // would vouch for the block after its next stream-ordered free (work queued after the event
  // would not be waited for), and it would never be released.
  rules_.clear(b);
  b->state = State::kAllocated;
  ++b->segment->live;
  allocated_.emplace(b->addr, b);
  allocated_bytes_ += b->size;
  *out = b;
  return CUDA_SUCCESS;
}

CachingPool::FreeSet::iterator CachingPool::first_fit_candidate(FreeSet& set, uint64_t size) {
  // Valid while no block entered or left the set (in-place shrinking by take() keeps the order,
  // and it keeps every block before the hinted one smaller than `size`, so the hinted block
  // stays the answer for as long as it is large enough itself).
  if (hint_.set == &set && hint_.version == free_version_ && hint_.size == size && (*hint_.it)->size >= size)
    return hint_.it;
  Block key;
  key.size = size;
  const FreeSet::iterator it = set.lower_bound(&key);
  if (it != set.end()) hint_ = FindHint{&set, it, free_version_, size};
  return it;
}

CachingPool::Block* CachingPool::find_free(uint64_t size, bool small, const AllocRequest& req) {
  FreeSet& set = free_set(small);
  // Blocks still in use by another stream are skipped; bound the scan so a long run of them
  // cannot make allocation linear in the number of free blocks.
  constexpr int kMaxScan = 64;
  int scanned = 0;
  for (auto it = first_fit_candidate(set, size); it != set.end() && scanned < kMaxScan; ++it, ++scanned) {
    Block* b = *it;
    // Oversize blocks are kept whole for requests of their own size class (max_split). Large
    // pool only, as in PyTorch: a small segment is at most small_segment, and a max_split that
    // low would keep each whole for the one request that took it, never to be used again.
    if (!small && size < opt_.max_split && b->size >= opt_.max_split) break;
    if (!small && size >= opt_.max_split && b->size >= size + opt_.large_segment) break;
    if (rules_.usable(b, req)) return take(set, it, size, small);
  }
  return nullptr;
}

bool CachingPool::worth_splitting(const Block* b, uint64_t size, bool small) const {
  const uint64_t rest = b->size - size;
  // Small blocks split down to the rounding; large ones only when the rest could serve a large
  // request, so large segments are not shredded into pieces only small requests could use.
  const bool worth_it = small ? rest >= opt_.round : rest > opt_.small_max;
  return worth_it && (small || b->size < opt_.max_split);
}

CachingPool::Block* CachingPool::take(FreeSet& set, FreeSet::iterator it, uint64_t size, bool small) {
  Block* b = *it;
  if (!worth_splitting(b, size, small)) {
    erase_free(set, it);
    return b;
  }
  // Most allocations carve from a large free block. The remainder is that block's end, and it
  // sorts before the block (smaller, or as large and further on) but after everything before
  // it, unless the previous element is at least as large: then the free block can stay in the
  // set, shrunk from the front, instead of an erase and an insert (the B-tree's costliest
  // operations, on every allocation). The front becomes a new block.
  const uint64_t rest = b->size - size;
  if (it != set.begin()) {
    const Block* before = *std::prev(it);
    if (before->size > rest || (before->size == rest && before->addr > b->addr + size)) {
      erase_free(set, it);
      return split(b, size, small);
    }
  }
  Block* front = new_block();
  front->addr = b->addr;
  front->size = size;
  front->segment = b->segment;
  front->prev = b->prev;
  front->next = b;
  if (b->prev) b->prev->next = front;
  b->prev = front;
  if (b->segment->head == b) b->segment->head = front;
  // Keys change in place, order kept (checked above). The remainder keeps its stream and event,
  // as split() would give them; the front has neither, as an allocated block must.
  b->addr += size;
  b->size = rest;
  return front;
}

CachingPool::Block* CachingPool::grow_in_place(uint64_t size) {
  // Only a segment whose free idle tail would take the new bytes: the request then costs what
  // that tail lacks, not a new segment. (Growing segments whose tail is live measured worse on
  // the trace corpus: the arena space after them is better left to whoever needs it next.)
  // The segment needing the fewest bytes is asked first, at most a few (each ask looks at the
  // arena's address index).
  struct Candidate {
    uint64_t need;
    Segment* seg;
    Block* tail;
  };
  std::vector<Candidate> candidates;
  for (auto& [base, seg] : segments_) {
    if (seg->small) continue;
    Block* tail = seg->head;
    while (tail->next != nullptr) tail = tail->next;
    if (tail->state != State::kFree || !rules_.idle(tail) || tail->size >= size) continue;
    candidates.push_back({round_up(size - tail->size, opt_.grow_in_place_unit), seg, tail});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.need != b.need ? a.need < b.need : a.seg->base < b.seg->base;
  });
  constexpr size_t kMaxAsks = 4;
  for (size_t i = 0; i < candidates.size() && i < kMaxAsks; ++i) {
    const Candidate& c = candidates[i];
    if (backend_.segment_extend(reinterpret_cast<void*>(c.seg->base), c.seg->size, c.need) != CUDA_SUCCESS) continue;
    c.seg->size += c.need;
    reserved_ += c.need;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++segment_grows_;
    // The tail takes the new bytes; out of the free set, as grow() returns a block that is.
    erase_free(large_free_, c.tail);
    c.tail->size += c.need;
    return c.tail;
  }
  return nullptr;
}

CachingPool::Block* CachingPool::grow(uint64_t size, bool small, CUresult* err) {
  if (opt_.grow_in_place_unit != 0 && !small && size <= opt_.medium_max) {
    if (Block* b = grow_in_place(size)) return b;
  }
  const uint64_t seg_size = segment_size_for(size);
  if (seg_size == 0) {
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return nullptr;
  }
  void* p = nullptr;
  *err = backend_.segment_alloc(seg_size, &p);
  if (*err != CUDA_SUCCESS) return nullptr;
  auto* seg = new Segment{reinterpret_cast<uintptr_t>(p), seg_size, small};
  segments_.emplace(seg->base, seg);
  reserved_ += seg_size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++segment_allocs_;
  Block* b = new_block();
  b->addr = seg->base;
  b->size = seg_size;
  b->segment = seg;
  seg->head = b;
  return b;
}

CachingPool::Block* CachingPool::split(Block* b, uint64_t size, bool small) {
  if (!worth_splitting(b, size, small)) return b;
  const uint64_t rest = b->size - size;
  Block* r = new_block();
  r->addr = b->addr + size;
  r->size = rest;
  r->segment = b->segment;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  rules_.share(b, r);  // freed together with `b`
  insert_free(r);
  return b;
}

void CachingPool::insert_free(Block* b) {
  b->state = State::kFree;
  free_set(b->segment->small).insert(b);
  ++free_version_;
}

void CachingPool::coalesce_into_free(Block* b) {
  // Without a driver call: a block just freed on a stream next to one freed on another stream (or
  // a block ready for anyone next to one freed on a stream) stays apart, listed, until
  // settle_apart (every kSettleBatch frees) or settle_unmerged (before the pool grows). Asking
  // there, in a batch, costs one event per stream; asking here cost an event and a query on every
  // cudaFreeAsync that carved from a larger block (issue 30: the stream-ordered pair went from
  // 90 to 470 ns).
  //
  // A block freed on a stream (one that can be named: created, or the legacy stream) absorbs a
  // free neighbour ready for anyone, and the merged block is ordered by that stream: reusable at
  // once there, elsewhere once an event recorded after this free completes. Safe (the idle part
  // is only held back, never handed out sooner), and it is what PyTorch's per-stream blocks do.
  // Left apart, such a block merged only once its stream's work was done: on a device running
  // behind the host that is a backlog later, and best fit meanwhile carved new space around it
  // (detection_infer replayed stream-ordered under --gpu-time model: 174 vs PyTorch's 154 MiB;
  // 154 with this). The rest stays ready for anyone until such a free borders it.
  auto compatible = [&](Block* n) {
    if (n == nullptr || n->state != State::kFree) return false;
    if (ReuseRules<Block>::mergeable(n, b)) return true;
    if (n->stream == nullptr && (b->stream == CU_STREAM_LEGACY || names_created_stream(b->stream))) return true;
    unmerged_ = true;
    note_apart(n);
    note_apart(b);
    return false;
  };
  FreeSet& set = free_set(b->segment->small);
  if (compatible(b->prev)) {
    Block* p = b->prev;
    erase_free(set, p);
    rules_.absorb(b, p);  // keeps b's stream
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (p->prev) p->prev->next = b;
    if (b->segment->head == p) b->segment->head = b;
    recycle(p);
  }
  if (compatible(b->next)) {
    Block* n = b->next;
    // The free neighbour after `b` grows by `b`; unless the element after it in its set is now
    // smaller, it keeps its place there, so it takes `b` in, in place, and no B-tree erase or
    // insert is paid: a stream-ordered free of a block carved from a larger one merges with that
    // block's rest on every pair (measured: the 4 KiB stream-ordered pair's p50 as before, its
    // p99 0.2 instead of 9 us, no settling every 64 frees).
    // The last first fit is most often `n` itself (the block `b` was carved from): its iterator
    // then needs no lookup, and it stays the first fit as it grows (every block before it in the
    // set is still smaller than the size it was found for).
    const bool hinted = hint_.set == &set && hint_.version == free_version_ && *hint_.it == n;
    const auto it = hinted ? hint_.it : set.find(n);
    const auto after = std::next(it);
    const uint64_t merged = b->size + n->size;
    if (after == set.end() || (*after)->size > merged || ((*after)->size == merged && (*after)->addr > b->addr)) {
      const CUstream stream = b->stream;  // n's own, or n is ready for anyone and takes b's terms
      rules_.absorb(n, b);
      n->stream = stream;
      n->addr = b->addr;
      n->size = merged;
      n->prev = b->prev;
      if (b->prev) b->prev->next = n;
      if (n->segment->head == b) n->segment->head = n;
      if (!hinted) ++free_version_;  // n grew in place: a hinted first fit may no longer be the first
      recycle(b);
      return;
    }
    erase_free(set, it);
    rules_.absorb(b, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    recycle(n);
  }
  insert_free(b);
}

CUresult CachingPool::deallocate(void* p, CUstream stream, bool stream_ordered) {
  const CUresult r = deallocate_block(p, stream, stream_ordered, nullptr);
  return r == CUDA_ERROR_NOT_FOUND ? CUDA_ERROR_INVALID_VALUE : r;
}

CUresult CachingPool::deallocate_with(void* p, CUstream stream, bool stream_ordered, PayloadHooks& hooks) {
  return deallocate_block(p, stream, stream_ordered, &hooks);
}

CUresult CachingPool::deallocate_block(void* p, CUstream stream, bool stream_ordered, PayloadHooks* hooks) {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocated_.end()) return CUDA_ERROR_NOT_FOUND;
  Block* b = it->second;
  if (hooks != nullptr) {
    const BlockPlace place = place_of(b);
    if (!hooks->on_freeing(b->addr, b->size, b->payload, &place)) return CUDA_ERROR_NOT_PERMITTED;
  }
  allocated_.erase(it);
  deallocate_locked(b, stream, stream_ordered);
  return CUDA_SUCCESS;
}

bool CachingPool::find_payload(const void* p, BlockPayload* out) const {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocated_.end()) return false;
  *out = it->second->payload;
  return true;
}

void CachingPool::forget_streams(absl::FunctionRef<bool(CUstream)> doomed) {
  std::lock_guard<FutexMutex> lock(mu_);
  // Free-set order is by size and address: retagging a block leaves it in place.
  rules_.forget_streams(doomed, [&](auto&& fn) {
    for (Block* b : small_free_) fn(b);
    for (Block* b : large_free_) fn(b);
  });
}

void CachingPool::with_lock(absl::FunctionRef<void()> fn) const {
  std::lock_guard<FutexMutex> lock(mu_);
  fn();
}

void CachingPool::deallocate_locked(Block* b, CUstream stream, bool stream_ordered) {
  allocated_bytes_ -= b->size;
  --b->segment->live;
  b->state = State::kWaiting;
  if (rules_.retire(b, stream, stream_ordered)) {
    b->state = State::kFree;
    coalesce_into_free(b);
    if (!apart_.empty() && ++frees_since_settle_ >= kSettleBatch) settle_apart();
  }
}

void CachingPool::note_apart(Block* b) {
  if (b->stream == nullptr || b->listed_apart) return;
  b->listed_apart = true;
  apart_.push_back(b);
}

bool CachingPool::settle_apart() {
  frees_since_settle_ = 0;
  std::vector<Block*> asked;
  for (Block* b : apart_) {
    b->listed_apart = false;
    if (b->state != State::kFree || b->stream == nullptr) continue;
    const bool apart = (b->prev && b->prev->state == State::kFree && !ReuseRules<Block>::mergeable(b->prev, b)) ||
                       (b->next && b->next->state == State::kFree && !ReuseRules<Block>::mergeable(b, b->next));
    if (apart) asked.push_back(b);
  }
  apart_.clear();
  std::vector<Block*> idle = asked;
  rules_.settle(idle);
  for (Block* b : asked) note_apart(b);  // still in use (the idle ones are ready for anyone now)
  if (idle.empty()) return false;
  for (Block* b : idle) erase_free(free_set(b->segment->small), b);
  for (Block* b : idle) b->state = State::kWaiting;
  release_batch(idle, false);
  return true;
}

void CachingPool::release_batch(std::vector<Block*>& blocks, bool all_idle) {
  for (Block* b : blocks) b->state = State::kReleasing;
  if (all_idle) {
    // Every free block is idle too: out of the free sets and into this pass, so that every run of
    // address-adjacent idle blocks is merged once and inserted once, rather than a B-tree erase
    // and insert for every merge (thousands after a long wait). Save blocks freed in another
    // context's stream order, which the synchronization did not cover: they stay as they are.
    std::vector<Block*> still_used;
    for (FreeSet* set : {&small_free_, &large_free_}) {
      for (Block* b : *set) {
        if (!sync_releases_everything_ && !rules_.synchronized_idle(b)) {
          still_used.push_back(b);
          continue;
        }
        b->state = State::kReleasing;
        blocks.push_back(b);
      }
      set->clear();
      ++free_version_;
    }
    for (Block* b : blocks)
      if (b->stream != nullptr || b->event != nullptr) rules_.clear(b);
    for (Block* b : apart_) b->listed_apart = false;
    apart_.clear();
    for (Block* b : still_used) {
      free_set(b->segment->small).insert(b);
      note_apart(b);
    }
    unmerged_ = !still_used.empty();  // every other run of free blocks becomes one
  }
  for (Block* b : blocks) {
    if (b->state != State::kReleasing) continue;  // already part of an earlier run
    Block* head = b;
    while (head->prev && head->prev->state == State::kReleasing) head = head->prev;
    while (head->next && head->next->state == State::kReleasing) {
      Block* n = head->next;
      head->size += n->size;
      head->next = n->next;
      if (n->next) n->next->prev = head;
      n->state = State::kMerged;  // recycled below: `blocks` may still name it
    }
    // Ready for anyone; a free neighbour ready for anyone joins it (after a sync there is none).
    head->state = State::kFree;
    if (all_idle) insert_free(head);
    else coalesce_into_free(head);
  }
  for (Block* b : blocks)
    if (b->state == State::kMerged) recycle(b);
}

bool CachingPool::exact_fit_free(uint64_t size, bool small) {
  FreeSet& set = free_set(small);
  const FreeSet::iterator it = first_fit_candidate(set, size);
  return it != set.end() && (*it)->size == size;
}

bool CachingPool::settle_unmerged() {
  if (!unmerged_) return false;
  unmerged_ = false;
  std::vector<Block*> tagged;
  auto apart = [](const Block* x, const Block* y) {
    return x != nullptr && y != nullptr && x->state == State::kFree && y->state == State::kFree &&
           !ReuseRules<Block>::mergeable(x, y);
  };
  for (FreeSet* set : {&small_free_, &large_free_})
    for (Block* b : *set)
      if (b->stream != nullptr && (apart(b->prev, b) || apart(b, b->next))) tagged.push_back(b);
  const size_t asked = tagged.size();
  rules_.settle(tagged);  // keeps those now ready for anyone
  if (tagged.size() < asked) unmerged_ = true;  // the rest are asked again before the next growth
  if (tagged.empty()) return false;
  for (Block* b : tagged) erase_free(free_set(b->segment->small), b);
  for (Block* b : tagged) b->state = State::kWaiting;  // as the reuse rules hand blocks back
  release_batch(tagged, false);
  return true;
}

bool CachingPool::collect_idle() {
  return rules_.collect([&](std::vector<Block*>& blocks) { release_batch(blocks, false); });
}

bool CachingPool::sync_and_release() {
  return rules_.synchronize([&](std::vector<Block*>& blocks) { release_batch(blocks, true); });
}

void CachingPool::free_empty_segments(uint64_t keep) {
  for (auto it = segments_.begin(); it != segments_.end() && reserved_ >= keep;) {
    Segment* seg = it->second;
    ++it;
    // An empty segment is one free block spanning it: find it through the free set by size.
    FreeSet& set = free_set(seg->small);
    Block key;
    key.size = seg->size;
    key.addr = seg->base;
    auto bit = set.find(&key);
    if (bit == set.end()) continue;
    Block* b = *bit;
    if (!rules_.idle(b)) continue;
    if (backend_.segment_free(reinterpret_cast<void*>(seg->base), seg->size) != CUDA_SUCCESS) continue;
    erase_free(set, bit);
    recycle(b);
    segments_.erase(seg->base);
    reserved_ -= seg->size;
    ++segment_frees_;
    delete seg;
  }
}

void CachingPool::trim_free_tails() {
  // The whole chunks at the end of a segment that lie in its free idle tail go back: a grown
  // segment rarely becomes empty as a whole, and those chunks can serve anything elsewhere.
  const uint64_t unit = opt_.grow_in_place_unit;
  for (auto& [base, seg] : segments_) {
    Block* tail = seg->head;
    while (tail->next != nullptr) tail = tail->next;
    if (tail->state != State::kFree || !rules_.idle(tail) || tail == seg->head) continue;
    const uint64_t keep = round_up(tail->addr - seg->base, unit);
    if (keep >= seg->size) continue;
    if (backend_.segment_shrink(reinterpret_cast<void*>(seg->base), seg->size, keep) != CUDA_SUCCESS) continue;
    const uint64_t cut = seg->size - keep;
    seg->size = keep;
    reserved_ -= cut;
    FreeSet& set = free_set(seg->small);
    erase_free(set, tail);
    if (tail->size == cut) {
      tail->prev->next = nullptr;
      recycle(tail);
    } else {
      tail->size -= cut;
      insert_free(tail);
    }
  }
}

bool CachingPool::contains(const void* p) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = segments_.upper_bound(a);
  if (it == segments_.begin()) return false;
  --it;
  return a < it->first + it->second->size;
}

void CachingPool::figures(PoolFigures* out) const {
  std::lock_guard<FutexMutex> lock(mu_);
  out->reserved_bytes = reserved_;
  out->peak_reserved_bytes = peak_reserved_;
  out->cached_free_bytes = reserved_ - allocated_bytes_;
  out->quarantined_bytes = rules_.waiting_bytes();
  uint64_t largest = 0;
  if (!small_free_.empty()) largest = std::max(largest, (*small_free_.rbegin())->size);
  if (!large_free_.empty()) largest = std::max(largest, (*large_free_.rbegin())->size);
  out->largest_free_block = largest;
  out->segment_allocs = segment_allocs_;
  out->segment_frees = segment_frees_;
  out->alloc_retries = retries_;
  out->ooms = ooms_;
  out->reuse_syncs = rules_.syncs();
  out->reuse_waits = rules_.waits();
  // Every block is a heap node (spares kept for recycling too); free ones also sit in a B-tree
  // (about two pointers per element with node overhead), live ones in the address index.
  constexpr uint64_t kHeapOverhead = 16;
  constexpr uint64_t kSetNode = 2 * sizeof(Block*);
  constexpr uint64_t kMapNode = 4 * sizeof(void*) + 2 * sizeof(uintptr_t) + kHeapOverhead;  // segments_
  const uint64_t free_blocks = small_free_.size() + large_free_.size();
  const uint64_t blocks = free_blocks + rules_.waiting_blocks() + allocated_.size() + spare_blocks_.size();
  out->host_bytes = blocks * (sizeof(Block) + kHeapOverhead) + free_blocks * kSetNode +
                    rules_.waiting_capacity() * sizeof(Block*) +
                    allocated_.capacity() * (sizeof(uintptr_t) + sizeof(Block*) + 1) +
                    segments_.size() * (sizeof(Segment) + kHeapOverhead + kMapNode);
}

bool CachingPool::find_block(const void* p, uintptr_t* base, uint64_t* size) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = segments_.upper_bound(a);
  if (it == segments_.begin()) return false;
  --it;
  if (a >= it->first + it->second->size) return false;
  // Linear in the segment's blocks; pointer queries are rare next to allocations.
  for (const Block* b = it->second->head; b != nullptr; b = b->next) {
    if (a >= b->addr + b->size) continue;
    if (b->state != State::kAllocated) return false;
    *base = b->addr;
    *size = b->size;
    return true;
  }
  return false;
}

const char* CachingPool::ipc_export_refusal(const void* block, uint64_t) const {
  std::lock_guard<FutexMutex> lock(mu_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(block));
  if (it == allocated_.end()) return "not a live block of this pool";
  // At the start of its segment, the importer maps the segment's start: the caller's own bytes.
  if (it->second->addr == it->second->segment->base) return nullptr;
  return "carved out of a pooled segment, not at its start: CUDA's handle describes the whole segment, so an "
         "importing process would map the segment's start, i.e. other bytes";
}

void CachingPool::live_payload_blocks(std::vector<uintptr_t>* out) const {
  std::lock_guard<FutexMutex> lock(mu_);
  for (const auto& [addr, b] : allocated_) out->push_back(addr);
}

void CachingPool::release_cached() {
  std::lock_guard<FutexMutex> lock(mu_);
  release_cached_locked();
}

void CachingPool::release_before_reset() {
  std::lock_guard<FutexMutex> lock(mu_);
  sync_releases_everything_ = true;
  release_cached_locked();
  sync_releases_everything_ = false;
}

void CachingPool::release_cached_locked() {
  // Whatever is idle already goes back without waiting; the sync (which a caller may refuse, see
  // VmmPool::reclaim_segments) then makes the rest idle.
  collect_idle();
  if (!sync_and_release()) settle_unmerged();
  free_empty_segments();
}

void CachingPool::trim_to(uint64_t keep) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (keep != 0 && reserved_ < keep) return;
  // Freed blocks are known idle only after a synchronization (none during a capture). Callers
  // trim right after synchronizing (PyTorch's empty_cache), so this one costs them nothing.
  if (!sync_and_release()) settle_unmerged();
  free_empty_segments(keep);
}

}  // namespace gpushim
