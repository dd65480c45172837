#include "policy/vmm_arena.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace gpushim {
namespace {

uint64_t round_up(uint64_t v, uint64_t m) { return v > UINT64_MAX - (m - 1) ? 0 : (v + m - 1) / m * m; }
uint64_t round_down(uint64_t v, uint64_t m) { return v / m * m; }

}  // namespace

VmmArena::VmmArena(Backend& backend, const VmmPoolOptions& options)
    : backend_(backend),
      opt_(options),
      gran_(backend.granularity()),
      unit_(options.whole_chunks || options.round == 0 ? gran_ : std::min<uint64_t>(options.round, gran_)),
      rules_(backend, options.quarantine_bytes) {}

VmmArena::~VmmArena() {
  // Only unit tests and the replay destroy a pool; the shim keeps its pools for the whole process.
  auto drop = [&](Block* b) {
    rules_.clear(b);
    delete b;
  };
  for (auto& [a, b] : blocks_)
    if (b->state == State::kLent || b->state == State::kShadow) delete b;
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
    b = build(want, cls, attempt, &err);
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
    b->born = ++allocs_;
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

VmmArena::Block* VmmArena::find_free(uint64_t size, uint8_t cls, const AllocRequest& req, Fit fit) {
  Reservation key_res;
  key_res.cls = cls;
  Block key;
  key.res = &key_res;
  key.size = size;
  // Blocks still in use by another stream are skipped; bound the scan so a long run of them
  // cannot make allocation linear in the number of free blocks.
  constexpr int kMaxScan = 64;
  int scanned = 0;
  auto found = free_.end();
  // Picking by address reads every candidate up to its bound, where best fit stops at the first
  // usable one: a tighter bound keeps that cheap (vmm_arena.h, long_fall, says what it costs).
  constexpr int kMaxPick = 16;
  const int limit = fit == Fit::kBest ? kMaxScan : kMaxPick;
  for (auto it = free_.lower_bound(&key); it != free_.end() && scanned < limit; ++it, ++scanned) {
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
  learn_lifetime(b);
  user_allocated_ -= b->size;
  b->state = State::kWaiting;
  if (rules_.retire(b, stream, stream_ordered)) {
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
    if ((*it)->stream == nullptr) {
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

void VmmArena::learn_lifetime(const Block* b) {
  if (opt_.long_fall <= 0) return;
  // The least live bytes since the block's allocation: the first low recorded after it, or what
  // is live now (the block included), or what was live just after it.
  uint64_t least = std::min(b->born_live, user_allocated_);
  auto low = std::lower_bound(lows_.begin(), lows_.end(), b->born,
                              [](const std::pair<uint64_t, uint64_t>& e, uint64_t t) { return e.first < t; });
  if (low != lows_.end()) least = std::min(least, low->second);
  // A trough: live bytes fell well below their level at the allocation and rose well above that
  // low again before the free. A fall alone is not one: blocks freed last in a run of frees see
  // live bytes fall to their own size, and stay where the others were.
  const bool outlived = static_cast<double>(b->born_live - least) > opt_.long_fall * static_cast<double>(b->born_live) &&
                        static_cast<double>(user_allocated_ - least) > opt_.long_rise * static_cast<double>(user_allocated_);
  auto it = long_votes_.find(b->size);
  if (it == long_votes_.end()) {
    if (outlived && long_votes_.size() < kMaxLongSizes) long_votes_.emplace(b->size, 1);
  } else if (outlived) {
    it->second = static_cast<int8_t>(std::min<int>(it->second + 1, kMaxVotes));
  } else {
    it->second = static_cast<int8_t>(std::max<int>(it->second - 1, -kMaxVotes));
  }
  // What this free leaves live is the newest low (lows_ stays increasing).
  const uint64_t left = user_allocated_ - b->size;
  while (!lows_.empty() && lows_.back().second >= left) lows_.pop_back();
  // Only a pathological run of frees each leaving more live than the last grows it this far;
  // dropping the oldest entries only makes old blocks look shorter-lived.
  if (lows_.size() == kMaxLows) lows_.erase(lows_.begin(), lows_.begin() + kMaxLows / 2);
  lows_.emplace_back(allocs_, left);
}

VmmArena::Block* VmmArena::split(Block* b, uint64_t size, bool from_top) {
  if (b->size == size) return b;
  auto* r = new_block();
  r->size = b->size - size;
  r->res = b->res;
  rules_.share(b, r);  // freed together with `b`
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
  // both ready for anyone, or both freed on the same stream (b's event, the newest, covers both).
  // `b` is not in the free set (its key changes here); touching means no unmapped hole between.
  auto compatible = [&](Block* n) { return n != nullptr && n->state == State::kFree && rules_.mergeable_now(n, b); };
  if (Block* p = before(b); compatible(p)) {
    free_.erase(p);
    rules_.absorb(b, p);
    blocks_.erase(b->addr);
    b->addr = p->addr;
    b->size += p->size;
    blocks_[b->addr] = b;  // takes over p's entry
    recycle(p);
  }
  if (Block* n = after(b); compatible(n)) {
    free_.erase(n);
    rules_.absorb(b, n);
    blocks_.erase(n->addr);
    b->size += n->size;
    recycle(n);
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// Building a block by mapping: holes filled in place, stitching, new memory

std::vector<VmmArena::Piece*> VmmArena::movable_pieces(uintptr_t lo, uintptr_t hi) {
  // A piece can be moved (or released) only when idle free blocks cover all of it: then nothing
  // live lies on it and no work still queued can touch it (their events are complete, or there
  // never was one). Unmapping does not wait for queued work on every driver, so a block freed on
  // the requesting stream with its event pending does not qualify, unlike reuse in place. Blocks
  // share chunks, so a piece may lie across several touching free blocks (not merged because
  // their streams differed when they were freed): runs of them count. Pieces overlapping
  // [lo, hi) are left out: that is where the new block goes.
  // Highest addresses first: taking pieces from the top and filling holes lower down compacts
  // the mapped memory toward the bottom of the lowest ranges; emptied ranges are freed.
  std::vector<Piece*> out;
  if (backend_.capture_active()) return out;  // unmapping may wait for the device: not now
  auto it = blocks_.begin();
  while (it != blocks_.end()) {
    Block* b = it->second;
    ++it;
    if (b->state != State::kFree || !idle(b)) continue;
    const Reservation* res = b->res;
    const uintptr_t start = b->addr;
    uintptr_t end = b->addr + b->size;
    while (it != blocks_.end() && it->first == end && it->second->res == res && it->second->state == State::kFree &&
           idle(it->second)) {
      end += it->second->size;
      ++it;
    }
    if (end - start < gran_) continue;
    for (auto p = pieces_.lower_bound(start); p != pieces_.end() && p->first + p->second->size <= end; ++p)
      if (!(p->second->va < hi && lo < p->second->va + p->second->size)) out.push_back(p->second);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

bool VmmArena::make_plan(uint64_t size, uint8_t cls, Plan* best) {
  // A window is a run of touching idle free blocks and unmapped holes inside one reservation (a
  // hole at its end may continue past it when the range after it can be reserved). Any
  // [addr, addr + size) inside a window becomes one block once its holes are mapped, so the best
  // place is the one with the fewest hole bytes: fewest map calls, and free memory reused where
  // it is. Among places that map as much, the one whose block covers the most of what is already
  // mapped and free wins (it leaves the slack in the chunks it maps, as one free end there,
  // instead of in fragments of old chunks); then the lowest address, which keeps mapped memory
  // compact.
  //
  // With alias_tails, a hole chunk at either end of the block costs nothing when a partly used
  // chunk can lend what the block needs there (build_at maps it a second time); the least
  // offset a free tail starts at and the greatest one a free head reaches decide that.
  bool have = false;
  uint64_t best_cost = 0, best_slack = 0;
  // slack: bytes of the chunks the block maps that it leaves free. At equal cost and hole bytes,
  // more slack means more of the block lies in memory mapped already.
  auto consider = [&](Reservation* r, uintptr_t addr, uint64_t holes, uint64_t extend, uint64_t cost, uint64_t slack) {
    if (have && (cost != best_cost ? cost > best_cost
                 : holes != best->hole_bytes ? holes > best->hole_bytes
                 : slack != best_slack ? slack < best_slack
                 : addr >= best->addr))
      return;
    *best = Plan{cls, r, addr, holes, extend};
    best_cost = cost;
    best_slack = slack;
    have = true;
  };
  uint64_t min_tail = 0, max_head = 0;  // 0: none to lend
  if (alias_ok_) lendable(&min_tail, &max_head);
  enum class Kind : uint8_t { kHole, kFree, kWall };
  struct Span {
    uintptr_t start, end;
    Kind kind;
  };
  std::vector<Span> spans;
  for (auto& entry : reservations_) {
    // A plain variable, not a structured binding: lambdas below capture it, which C++20 compilers
    // before clang 16 reject for bindings.
    Reservation* const r = entry.second;
    if (r->cls != cls) continue;
    // Address-ordered spans of the reservation: idle free blocks, walls (every other block) that
    // separate windows, and holes, which are the gaps between blocks since blocks tile the pieces.
    spans.clear();
    uintptr_t cur = r->base;
    for (auto it = blocks_.lower_bound(r->base); it != blocks_.end() && it->first < r->end; ++it) {
      Block* b = it->second;
      if (b->addr > cur) spans.push_back({cur, b->addr, Kind::kHole});
      spans.push_back({b->addr, b->addr + b->size, b->state == State::kFree && idle(b) ? Kind::kFree : Kind::kWall});
      cur = b->addr + b->size;
    }
    if (cur < r->end) spans.push_back({cur, r->end, Kind::kHole});
    // Windows: maximal runs of touching non-wall spans. Candidate starts within one are span
    // starts and span ends minus `size` (the hole bytes are piecewise linear between those).
    std::vector<uint64_t> prefix;
    size_t i = 0;
    while (i < spans.size()) {
      if (spans[i].kind == Kind::kWall) {
        ++i;
        continue;
      }
      size_t j = i;
      prefix.assign(1, 0);  // hole bytes before span i + k
      while (j < spans.size() && spans[j].kind != Kind::kWall && (j == i || spans[j].start == spans[j - 1].end)) {
        prefix.push_back(prefix.back() + (spans[j].kind == Kind::kHole ? spans[j].end - spans[j].start : 0));
        ++j;
      }
      const uintptr_t w_start = spans[i].start, w_end = spans[j - 1].end;
      const bool open = w_end == r->end && r->extendable;
      auto holes_before = [&](uintptr_t x) {  // hole bytes in [w_start, x), x in the window
        const size_t k = static_cast<size_t>(
            std::partition_point(spans.begin() + static_cast<std::ptrdiff_t>(i), spans.begin() + static_cast<std::ptrdiff_t>(j),
                                 [x](const Span& sp) { return sp.end <= x; }) -
            spans.begin());
        uint64_t h = prefix[k - i];
        if (k < j && spans[k].kind == Kind::kHole && x > spans[k].start) h += x - spans[k].start;
        return h;
      };
      auto try_at = [&](uintptr_t a) {
        const uintptr_t e = a + size;
        if (a < w_start || e < a || e > UINTPTR_MAX - gran_ || (e > w_end && !open)) return;
        // Holes are whole chunks: a block reaching into one maps every chunk it touches there.
        // (Rounding cannot leave the window: a rounded end past w_end would lie in a chunk that
        // a mapped free block of the window shares, or in the extension.)
        const uintptr_t lo = std::max<uintptr_t>(round_down(a, gran_), w_start);
        const uintptr_t hi = std::min<uintptr_t>(round_up(e, gran_), w_end);
        const uint64_t extend = e > w_end ? round_up(e, gran_) - w_end : 0;
        const uint64_t holes = holes_before(hi) - holes_before(lo) + extend;
        uint64_t cost = holes;
        auto hole_chunk = [&](uintptr_t c) {
          if (c < w_start) return false;
          if (c >= w_end) return true;  // in the extension
          return c + gran_ <= w_end && holes_before(c + gran_) - holes_before(c) == gran_;
        };
        const uintptr_t fc = round_down(a, gran_), lc = round_down(e - 1, gran_);
        bool head = false, tail = false;
        if (min_tail != 0 || max_head != 0) {
          if (min_tail != 0 && a > fc && a - fc >= min_tail && hole_chunk(fc)) {
            head = true;
            cost -= gran_;
          }
          if (max_head != 0 && !(head && lc == fc) && e - lc < gran_ && e - lc <= max_head && hole_chunk(lc)) {
            tail = true;
            cost -= gran_;
          }
        }
        uint64_t slack = 0;  // lent ends are the lender's free memory, not slack of this build
        if (!head && a > fc && hole_chunk(fc)) slack += a - fc;
        if (!tail && e % gran_ != 0 && hole_chunk(lc) && !(head && lc == fc)) slack += round_up(e, gran_) - e;
        consider(r, a, holes, extend, cost, slack);
      };
      for (size_t k = i; k < j; ++k) {
        try_at(spans[k].start);
        if (spans[k].end - w_start >= size) try_at(spans[k].end - size);
        // A block may start inside a hole chunk where a lent tail begins.
        if (min_tail != 0 && spans[k].kind == Kind::kHole) try_at(spans[k].start + min_tail);
      }
      if (min_tail != 0 && open) try_at(w_end + min_tail);
      i = j;
    }
  }
  // A new reservation: all of it to map.
  consider(nullptr, UINTPTR_MAX, round_up(size, gran_), 0, round_up(size, gran_), round_up(size, gran_) - size);
  return have;
}

void VmmArena::plan_fill(const Plan& plan, uint64_t size, std::vector<Piece*>& movable, std::vector<Slot>* slots) const {
  // The holes of [addr, addr + size), each split at the reservation's end (a piece never spans
  // two driver reservations), are filled with movable pieces that fit, then with new pieces.
  std::vector<std::pair<uintptr_t, uintptr_t>> holes;
  const uintptr_t a = round_down(plan.addr, gran_), e = round_up(plan.addr + size, gran_);
  uintptr_t cur = a;
  auto it = pieces_.upper_bound(a);
  if (it != pieces_.begin() && std::prev(it)->first + std::prev(it)->second->size > a) --it;  // a run reaching into it
  for (; it != pieces_.end() && it->first < e; ++it) {
    if (it->first > cur) holes.emplace_back(cur, it->first);
    cur = std::max(cur, it->first + it->second->size);
  }
  if (cur < e) holes.emplace_back(cur, e);
  // Split at the boundaries between the driver reservations the range is made of.
  for (size_t k = 1; k < plan.res->parts.size(); ++k) {
    const uintptr_t cut = plan.res->parts[k].first;
    for (size_t h = 0; h < holes.size(); ++h) {
      if (holes[h].first < cut && cut < holes[h].second) {
        holes.insert(holes.begin() + static_cast<std::ptrdiff_t>(h) + 1, {cut, holes[h].second});
        holes[h].second = cut;
      }
    }
  }
  const uint64_t cap = opt_.piece > gran_ ? opt_.piece / gran_ * gran_ : gran_;
  size_t first_unused = 0;  // movable[0, first_unused) are all taken
  for (auto [h, end] : holes) {
    for (size_t k = first_unused; k < movable.size() && h < end; ++k) {
      if (movable[k] == nullptr || movable[k]->size > end - h) continue;
      slots->push_back({h, movable[k]->size, movable[k]});
      h += movable[k]->size;
      movable[k] = nullptr;
      while (first_unused < movable.size() && movable[first_unused] == nullptr) ++first_unused;
    }
    while (h < end) {
      const uint64_t n = std::min<uint64_t>(end - h, cap);
      slots->push_back({h, n, nullptr});
      h += n;
    }
  }
}

VmmArena::Reservation* VmmArena::reserve_range(uint64_t size, uintptr_t hint, CUresult* err) {
  uintptr_t va = 0;
  *err = backend_.va_reserve(size, hint, &va);
  if (*err != CUDA_SUCCESS) return nullptr;
  ++stats_.va_reserves;
  auto* r = new Reservation;
  r->base = va;
  r->end = va + size;
  r->parts.emplace_back(va, size);
  reservations_.emplace(va, r);
  return r;
}

VmmArena::Block* VmmArena::build(uint64_t size, uint8_t cls, Attempt* attempt, CUresult* err) {
  // Extending a reservation fails when something else took the range after it; then that one
  // stops being extendable and the plan is made again (the range the driver gave instead is kept
  // as a reservation of its own, large enough for this block).
  // Before planning: a retired alias frees its range (perhaps its reservation) and its lent tail.
  if (!aliases_.empty()) retire_aliases();
  bool replanned = false;
  Block* b = nullptr;
  bool built = false;
  for (int tries = 0; tries < 8 && !built; ++tries) {
    Plan plan;
    if (!make_plan(size, cls, &plan)) break;
    bool replan = false;
    b = build_at(plan, size, attempt, err, &replan);
    replanned |= replan;
    built = !replan;
  }
  // The next plan may place the block elsewhere after all (lending or memory already mapped can
  // make another place cheaper than the range the driver gave): an unused range goes back.
  if (replanned) free_empty_reservations();
  if (!built) *err = CUDA_ERROR_OUT_OF_MEMORY;
  return built ? b : nullptr;
}

VmmArena::Block* VmmArena::build_at(Plan plan, uint64_t size, Attempt* attempt, CUresult* err, bool* replan) {
  const uint64_t reserve = std::max(round_up(size, gran_), round_up(opt_.reserve, gran_));
  {
    const uintptr_t lo = plan.res ? round_down(plan.addr, gran_) : 0, hi = plan.res ? round_up(plan.addr + size, gran_) : 0;
    std::vector<Piece*> movable = movable_pieces(lo, hi);
    if (!attempt->over_budget && opt_.remap_budget > 0 && !movable.empty()) {
      uint64_t would_move = 0;
      for (const Piece* p : movable) would_move += p->size;
      would_move = std::min(would_move, plan.hole_bytes);
      // At least 256 MiB, so that a small pool may still stitch what it has.
      const double budget = opt_.remap_budget * static_cast<double>(std::max<uint64_t>(held_, 256ull << 20));
      if (static_cast<double>(moved_since_growth_ + would_move) > budget) movable.clear();
    }
    if (!attempt->may_create) {
      uint64_t available = 0;
      for (const Piece* p : movable) available += p->size;
      if (available < plan.hole_bytes) {
        attempt->new_bytes = plan.hole_bytes - available;
        *err = CUDA_ERROR_NOT_READY;
        return nullptr;
      }
    }
    // 1. Virtual space first: it costs no memory, and its failure leaves nothing to undo.
    if (plan.res == nullptr) {
      plan.res = reserve_range(reserve, 0, err);
      if (plan.res == nullptr) return nullptr;
      plan.res->cls = plan.cls;
      plan.addr = plan.res->base;
    } else if (plan.extend > 0) {
      Reservation* r = plan.res;
      const uint64_t n = std::max(plan.extend, reserve);
      uintptr_t va = 0;
      *err = backend_.va_reserve(n, r->end, &va);
      if (*err != CUDA_SUCCESS) return nullptr;
      ++stats_.va_reserves;
      if (va != r->end) {
        r->extendable = false;
        auto* fresh = new Reservation;
        fresh->base = va;
        fresh->end = va + n;
        fresh->parts.emplace_back(va, n);
        fresh->cls = r->cls;
        reservations_.emplace(va, fresh);
        *replan = true;
        return nullptr;
      }
      r->parts.emplace_back(va, n);
      r->end += n;
      ++stats_.extensions;
    }
    // 2. What goes where: free pieces from elsewhere where they fit, new ones for the rest.
    std::vector<Slot> slots;
    // The block's first and last chunks, when they are holes, may instead be second mappings of
    // partly used chunks whose free part covers what the block uses there: its head needs a
    // chunk's free tail from its own start offset on, its tail a chunk's free head up to its own
    // end offset (VmmPoolOptions::alias_tails). Then the holes between are filled as usual. This
    // is done even when idle free pieces could fill those chunks: a free end can serve only a
    // block's end (or a request that fits in it), a wholly free piece any block anywhere, so the
    // ends are spent first and the pieces kept for the builds that need whole chunks.
    std::vector<Piece*> lent;
    Piece* head = nullptr;
    Piece* tail = nullptr;
    uintptr_t fill_lo = plan.addr, fill_hi = plan.addr + size;
    if (alias_ok_) {
      const uintptr_t first = round_down(plan.addr, gran_), last = round_down(plan.addr + size - 1, gran_);
      auto unmapped = [&](uintptr_t c) {
        auto next = pieces_.lower_bound(c);
        return c + gran_ <= plan.res->end && (next == pieces_.end() || next->first >= c + gran_) &&
               (next == pieces_.begin() || std::prev(next)->first + std::prev(next)->second->size <= c);
      };
      if (plan.addr > first && unmapped(first)) {
        head = lend(plan.addr - first, true, first, last + gran_);
        if (head != nullptr) {
          lent.push_back(head);
          fill_lo = first + gran_;
        }
      }
      const uintptr_t end = plan.addr + size;
      if (!(head != nullptr && last == first) && end < last + gran_ && unmapped(last)) {
        tail = lend(end - last, false, first, last + gran_);
        if (tail != nullptr) {
          lent.push_back(tail);
          fill_hi = last;
        }
      }
    }
    if (head != nullptr) slots.push_back({round_down(plan.addr, gran_), gran_, head});
    if (fill_hi > fill_lo) {
      Plan rest = plan;
      rest.addr = fill_lo;
      plan_fill(rest, fill_hi - fill_lo, movable, &slots);
    }
    if (tail != nullptr) slots.push_back({round_down(plan.addr + size - 1, gran_), gran_, tail});
    // 3. New physical memory next: if the device or the cap refuses it, nothing has moved yet.
    // (Pieces larger than a chunk may not fit the holes even when enough bytes are free.)
    if (!attempt->may_create) {
      for (const Slot& s : slots) attempt->new_bytes += s.moved ? 0 : s.size;
      if (attempt->new_bytes > 0) {
        for (Piece* a : lent) undo_lend(a);
        free_empty_reservations();
        *err = CUDA_ERROR_NOT_READY;
        return nullptr;
      }
    }
    std::vector<Piece*> fresh;
    for (const Slot& s : slots) {
      if (s.moved) continue;
      uint64_t handle = 0;
      *err = backend_.physical_create(s.size, &handle);
      if (*err != CUDA_SUCCESS) {
        for (Piece* p : fresh) release_piece_memory(p);
        for (Piece* a : lent) undo_lend(a);
        free_empty_reservations();
        return nullptr;
      }
      ++creates_;
      moved_since_growth_ = 0;
      held_ += s.size;
      peak_held_ = std::max(peak_held_, held_);
      fresh.push_back(new Piece{handle, s.size, 0, nullptr});
    }
    // 4. Unmap the pieces that move, and map every piece at its slot. Consecutive slots become
    // one free block (kept out of the free set: it is merged into the new block below).
    size_t next_fresh = 0;
    bool complete = true;
    CUresult failure = CUDA_SUCCESS;
    Block* run = nullptr;
    std::vector<uintptr_t> runs;
    for (const Slot& s : slots) {
      Piece* p = s.moved ? s.moved : fresh[next_fresh++];
      if (s.moved != nullptr && s.moved->alias_of != nullptr) {
        if (backend_.map(s.va, p->size, p->handle, 0) != CUDA_SUCCESS) {
          complete = false;
          undo_lend(p);
          continue;
        }
        ++maps_;
        ++stats_.aliases;
        mapped_ += p->size;
        alias_bytes_ += p->size;
        p->va = s.va;
        p->res = plan.res;
        ++plan.res->pieces;
        pieces_.emplace(s.va, p);
        aliases_.push_back(p);
        // The lent part keeps its offset in the chunk; the shadow is the rest of the chunk.
        const uintptr_t own = s.va + (p->lent->addr - p->alias_of->va), own_end = own + p->lent->size;
        Block* shadow = new_block();
        shadow->addr = own == s.va ? own_end : s.va;
        shadow->size = p->size - p->lent->size;
        shadow->res = plan.res;
        shadow->state = State::kShadow;
        blocks_.emplace(shadow->addr, shadow);
        p->shadow = shadow;
        if (run != nullptr && run->addr + run->size == own) {
          run->size += p->lent->size;
        } else {
          run = new_block();
          run->addr = own;
          run->size = p->lent->size;
          run->res = plan.res;
          run->state = State::kFree;
          blocks_.emplace(run->addr, run);
          runs.push_back(run->addr);
        }
        continue;
      }
      if (s.moved) {
        if (backend_.unmap(p->va, p->size) != CUDA_SUCCESS) {
          complete = false;  // it stays where it is, still mapped and free
          continue;
        }
        ++unmaps_;
        mapped_ -= p->size;
        carve_out(p);
        ++stats_.pieces_moved;
        moved_since_growth_ += p->size;
      }
      const CUresult r = backend_.map(s.va, p->size, p->handle, 0);
      if (r != CUDA_SUCCESS) {
        failure = r;
        complete = false;
        release_piece_memory(p);  // unmapped and unusable: back to the driver
        continue;
      }
      ++maps_;
      mapped_ += p->size;
      p->va = s.va;
      p->res = plan.res;
      ++plan.res->pieces;
      pieces_.emplace(s.va, p);
      if (run != nullptr && run->addr + run->size == s.va) {
        run->size += p->size;
        continue;
      }
      run = new_block();
      run->addr = s.va;
      run->size = p->size;
      run->res = plan.res;
      run->state = State::kFree;
      blocks_.emplace(run->addr, run);
      runs.push_back(run->addr);
    }
    free_empty_reservations();
    if (!complete) {
      // Whatever was mapped is free memory like any other: into the free set, merged with its
      // neighbours (looked up by address, as a merge may have swallowed a later run).
      for (uintptr_t a : runs) {
        Block* b = containing(a);
        if (b != nullptr && free_.count(b) == 0) insert_free(coalesce(b));
      }
      *err = failure != CUDA_SUCCESS ? failure : CUDA_ERROR_UNKNOWN;
      return nullptr;
    }
    // 5. [addr, addr + size) is now covered by idle free blocks: merge them into one (the first
    // and last may stick out; those parts stay free).
    Block* first = containing(plan.addr);
    free_.erase(first);
    rules_.clear(first);
    while (first->addr + first->size < plan.addr + size) {
      Block* n = after(first);
      free_.erase(n);
      rules_.clear(n);
      blocks_.erase(n->addr);
      first->size += n->size;
      recycle(n);
    }
    if (first->addr < plan.addr) {
      auto* head = new_block();
      head->addr = first->addr;
      head->size = plan.addr - first->addr;
      head->res = first->res;
      blocks_.erase(first->addr);
      first->addr = plan.addr;
      first->size -= head->size;
      blocks_.emplace(head->addr, head);
      blocks_.emplace(first->addr, first);
      insert_free(head);
    }
    ++stats_.builds;
    uint64_t mapped_here = 0;
    bool moved = false;
    for (const Slot& s : slots) {
      mapped_here += s.size;
      moved |= s.moved != nullptr;
    }
    if (mapped_here < size) ++stats_.grows_in_place;
    if (moved) ++stats_.stitches;
    return first;  // split() trims what sticks out at the end
  }
}

VmmArena::Piece* VmmArena::lend(uint64_t offset, bool tail, uintptr_t skip_lo, uintptr_t skip_hi) {
  // Candidates are idle free blocks that cover a chunk's tail from at most `offset` on (tail), or
  // its head up to at least `offset` (head), while something else lies in the rest of the chunk:
  // such a chunk can neither move nor be released. The tightest fit is taken, so that larger
  // free parts stay for larger needs. The chunk must be one whole piece, not itself a second
  // mapping, and lend only once per side.
  Block* best = nullptr;
  uint64_t best_len = 0;
  for (Block* f : free_) {
    const uintptr_t fe = f->addr + f->size;
    uintptr_t lo, hi;
    if (tail) {
      if (f->addr % gran_ == 0 || f->addr % gran_ > offset || fe < round_up(f->addr, gran_)) continue;
      lo = f->addr;
      hi = round_up(f->addr, gran_);
    } else {
      if (fe % gran_ == 0 || fe % gran_ < offset || f->addr > round_down(fe, gran_)) continue;
      lo = round_down(fe, gran_);
      hi = fe;
    }
    if ((best != nullptr && hi - lo >= best_len) || (lo < skip_hi && skip_lo < hi) || !idle(f)) continue;
    if (!lendable_chunk(round_down(lo, gran_), lo, hi)) continue;
    best = f;
    best_len = hi - lo;
  }
  if (best == nullptr) return nullptr;
  free_.erase(best);
  rules_.clear(best);
  const uintptr_t c = tail ? round_down(best->addr, gran_) : round_down(best->addr + best->size - 1, gran_);
  const uintptr_t lo = std::max<uintptr_t>(best->addr, c), hi = std::min<uintptr_t>(best->addr + best->size, c + gran_);
  // The free block keeps [lo, hi); what lies outside stays free.
  if (best->addr + best->size > hi) {
    auto* rest = new_block();
    rest->addr = hi;
    rest->size = best->addr + best->size - hi;
    rest->res = best->res;
    blocks_.emplace(rest->addr, rest);
    insert_free(rest);
  }
  if (best->addr < lo) {
    auto* rest = new_block();
    rest->addr = best->addr;
    rest->size = lo - best->addr;
    rest->res = best->res;
    blocks_.erase(best->addr);
    blocks_.emplace(rest->addr, rest);
    blocks_.emplace(lo, best);
    insert_free(rest);
  }
  best->addr = lo;
  best->size = hi - lo;
  best->state = State::kLent;
  Piece* owner = pieces_.at(c);
  auto* alias = new Piece{owner->handle, gran_, 0, nullptr};
  alias->alias_of = owner;
  alias->lent = best;
  return alias;
}

bool VmmArena::lendable_chunk(uintptr_t c, uintptr_t lo, uintptr_t hi) const {
  // One whole piece, mapped once, and pinned: something outside [lo, hi) is live or may still be
  // used by queued work. A chunk whose blocks are all idle and free is not lent but moved whole
  // (stitching), and it may be moved by the very build that would lend it.
  auto p = pieces_.find(c);
  if (p == pieces_.end() || p->second->size != gran_ || p->second->alias_of != nullptr) return false;
  auto it = blocks_.upper_bound(c);
  if (it != blocks_.begin()) --it;
  for (; it != blocks_.end() && it->first < c + gran_; ++it) {
    const Block* b = it->second;
    if (b->addr + b->size <= c || (b->addr >= lo && b->addr + b->size <= hi)) continue;
    if (b->state != State::kFree || b->stream != nullptr) return true;
  }
  return false;
}

void VmmArena::lendable(uint64_t* min_tail, uint64_t* max_head) {
  // lend()'s candidates, summarized: what the most permissive tail and head would allow.
  for (Block* f : free_) {
    const uintptr_t fe = f->addr + f->size;
    const uint64_t x = f->addr % gran_, y = fe % gran_;
    // A free block may be both: a tail of the chunk it starts in and a head of the one it ends in.
    bool tail = x != 0 && fe >= round_up(f->addr, gran_) && (*min_tail == 0 || x < *min_tail);
    bool head = y != 0 && f->addr <= round_down(fe, gran_) && y > *max_head;
    if ((!tail && !head) || !idle(f)) continue;
    tail = tail && lendable_chunk(round_down(f->addr, gran_), f->addr, round_up(f->addr, gran_));
    head = head && lendable_chunk(round_down(fe, gran_), round_down(fe, gran_), fe);
    if (tail) *min_tail = x;
    if (head) *max_head = y;
  }
}

void VmmArena::undo_lend(Piece* alias) {
  Block* lent = alias->lent;
  insert_free(coalesce(lent));
  delete alias;
}

void VmmArena::retire_aliases() {
  if (backend_.capture_active()) return;  // unmapping may wait for the device: not now
  bool any = false;
  for (size_t i = 0; i < aliases_.size();) {
    Piece* a = aliases_[i];
    const uintptr_t lo = a->va + (a->lent->addr - a->alias_of->va), hi = lo + a->lent->size;
    bool free_now = true;
    // The own part's free block may begin before it (merged with the chunk before).
    auto it = blocks_.upper_bound(lo);
    if (it != blocks_.begin()) --it;
    for (; free_now && it != blocks_.end() && it->first < hi; ++it)
      free_now = it->second->state == State::kFree && idle(it->second);
    if (!free_now || backend_.unmap(a->va, a->size) != CUDA_SUCCESS) {
      ++i;
      continue;
    }
    ++unmaps_;
    mapped_ -= a->size;
    alias_bytes_ -= a->size;
    // The shadow joins the free run for carve_out, which turns the whole chunk into a hole.
    insert_free(a->shadow);
    carve_out(a);
    Block* lent = a->lent;
    rules_.clear(lent);
    insert_free(coalesce(lent));
    delete a;
    aliases_[i] = aliases_.back();
    aliases_.pop_back();
    any = true;
  }
  if (any) free_empty_reservations();
}

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

void VmmArena::carve_out(Piece* p) {
  // The piece, already unmapped, lies in a run of idle free blocks (movable_pieces): they become
  // one, which keeps the part below the piece; a new block takes the part above, and the piece's
  // range becomes a hole. (Merging idle free blocks is safe: no work can touch any of them.)
  Block* holder = containing(p->va);
  rules_.clear(holder);
  while (holder->addr + holder->size < p->va + p->size) {
    Block* n = after(holder);
    free_.erase(holder);  // its key changes
    free_.erase(n);
    rules_.clear(n);
    blocks_.erase(n->addr);
    holder->size += n->size;
    recycle(n);
    free_.insert(holder);
  }
  const uintptr_t pa = p->va, pe = p->va + p->size, ha = holder->addr, he = holder->addr + holder->size;
  free_.erase(holder);
  if (pe < he) {
    auto* above = new_block();
    above->addr = pe;
    above->size = he - pe;
    above->res = holder->res;
    blocks_.emplace(pe, above);
    insert_free(above);
  }
  if (pa > ha) {
    holder->size = pa - ha;
    insert_free(holder);
  } else {
    blocks_.erase(ha);
    recycle(holder);
  }
  pieces_.erase(pa);
  --p->res->pieces;
  p->va = 0;
  p->res = nullptr;
}

void VmmArena::release_piece_memory(Piece* p) {
  if (backend_.physical_release(p->handle, p->size) != CUDA_SUCCESS) {
    loose_.push_back(p);  // still held; retried by release_idle
    return;
  }
  held_ -= p->size;
  ++releases_;
  delete p;
}

void VmmArena::free_empty_reservations() {
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    Reservation* r = it->second;
    if (r->pieces != 0) {
      ++it;
      continue;
    }
    // Nothing is mapped there any more; a refused va_free would only leak virtual space.
    for (auto& [va, n] : r->parts)
      if (backend_.va_free(va, n) == CUDA_SUCCESS) ++stats_.va_frees;
    delete r;
    it = reservations_.erase(it);
  }
}

// ---------------------------------------------------------------------------------------------
// Giving memory back

void VmmArena::release_idle() {
  std::lock_guard<FutexMutex> lock(mu_);
  std::vector<Piece*> loose;
  loose.swap(loose_);
  for (Piece* p : loose) release_piece_memory(p);
  retire_aliases();
  for (Piece* p : movable_pieces(0, 0)) {
    if (backend_.unmap(p->va, p->size) != CUDA_SUCCESS) continue;
    ++unmaps_;
    mapped_ -= p->size;
    carve_out(p);
    release_piece_memory(p);
  }
  free_empty_reservations();
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
                    spare_.size() * (sizeof(Block) + kHeapOverhead) + lows_.capacity() * sizeof(lows_[0]) +
                    long_votes_.capacity() * (sizeof(uint64_t) + sizeof(int8_t) + 1);
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
    if (p->alias_of == nullptr || p->lent == nullptr || p->shadow == nullptr || pieces_.count(p->va) == 0) return "alias bookkeeping";
    if (p->lent->state != State::kLent || p->shadow->state != State::kShadow) return "alias walls";
    const uint64_t off = p->lent->addr - p->alias_of->va;
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
