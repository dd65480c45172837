// Planning a build of the vmm arena (vmm_arena.h, "What the virtual-memory API buys"): where a
// block that no free block can hold is made, and what fills the holes there. A file of its own
// because this is where the arena's placement decisions are taken (which window, which pieces
// move, which ends are lent, whether the remap budget allows moving): it reads the arena's state
// and makes no driver call, so a change of policy lands here and the mapping that carries a plan
// out (vmm_arena_mapping.cpp) stays the same. Lending's own decisions (which chunk lends an end)
// are in vmm_arena_lending.cpp.
#include "policy/vmm_arena.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace gpushim {

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
  // A second mapping (lending) is never moved or released: retire_aliases unmaps it.
  for_each_free_run([&](Block* b) { return idle(b); },
                    [&](uintptr_t start, uintptr_t end) {
                      for (Piece* p : whole_pieces(start, end, lo, hi))
                        if (p->alias_of == nullptr) out.push_back(p);
                    });
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<VmmArena::Piece*> VmmArena::whole_pieces(uintptr_t start, uintptr_t end, uintptr_t lo, uintptr_t hi) const {
  std::vector<Piece*> out;
  for (auto p = pieces_.lower_bound(start); p != pieces_.end() && p->first + p->second->size <= end; ++p)
    if (!(p->second->va < hi && lo < p->second->va + p->second->size)) out.push_back(p->second);
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
      spans.push_back({b->addr, b->addr + b->size, b->state == State::kFree && reusable_in_place(b) ? Kind::kFree : Kind::kWall});
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
bool VmmArena::pieces_to_move(const Plan& plan, uint64_t size, Attempt* attempt, std::vector<Piece*>* movable,
                              std::vector<uintptr_t>* borrowable, CUresult* err) {
  const uintptr_t lo = plan.res ? round_down(plan.addr, gran_) : 0, hi = plan.res ? round_up(plan.addr + size, gran_) : 0;
  *movable = movable_pieces(lo, hi);
  *borrowable = borrowable_chunks(lo, hi);
  if (!attempt->over_budget && opt_.remap_budget > 0 && (!movable->empty() || !borrowable->empty())) {
    uint64_t would_move = gran_ * borrowable->size();
    for (const Piece* p : *movable) would_move += p->size;
    would_move = std::min(would_move, plan.hole_bytes);
    // At least 256 MiB, so that a small pool may still stitch what it has.
    const double budget = opt_.remap_budget * static_cast<double>(std::max<uint64_t>(held_, 256ull << 20));
    if (static_cast<double>(moved_since_growth_ + would_move) > budget) {
      movable->clear();
      borrowable->clear();
    }
  }
  if (!attempt->may_create) {
    uint64_t available = gran_ * borrowable->size();
    for (const Piece* p : *movable) available += p->size;
    if (available < plan.hole_bytes) {
      attempt->new_bytes = plan.hole_bytes - available;
      *err = CUDA_ERROR_NOT_READY;
      return false;
    }
  }
  return true;
}

void VmmArena::plan_slots(const Plan& plan, uint64_t size, std::vector<Piece*>& movable,
                          const std::vector<uintptr_t>& borrowable, std::vector<Slot>* slots, std::vector<Piece*>* lent) {
  // The block's first and last chunks, when they are holes, may instead be second mappings of
  // partly used chunks whose free part covers what the block uses there: its head needs a
  // chunk's free tail from its own start offset on, its tail a chunk's free head up to its own
  // end offset (VmmPoolOptions::alias_tails). Then the holes between are filled as usual. This
  // is done even when idle free pieces could fill those chunks: a free end can serve only a
  // block's end (or a request that fits in it), a wholly free piece any block anywhere, so the
  // ends are spent first and the pieces kept for the builds that need whole chunks.
  const LentEnds ends = alias_ok_ ? lend_ends(plan, size) : LentEnds{nullptr, nullptr, plan.addr, plan.addr + size};
  if (ends.head != nullptr) lent->push_back(ends.head);
  if (ends.tail != nullptr) lent->push_back(ends.tail);
  if (ends.head != nullptr) slots->push_back({round_down(plan.addr, gran_), gran_, ends.head});
  if (ends.fill_hi > ends.fill_lo) {
    Plan rest = plan;
    rest.addr = ends.fill_lo;
    plan_fill(rest, ends.fill_hi - ends.fill_lo, movable, slots);
  }
  if (ends.tail != nullptr) slots->push_back({round_down(plan.addr + size - 1, gran_), gran_, ends.tail});
  // What idle pieces left to new memory, chunks the request's stream freed may serve instead.
  size_t next = 0;
  for (Slot& s : *slots) {
    if (s.moved != nullptr || s.size != gran_) continue;
    while (next < borrowable.size() && s.moved == nullptr) s.moved = borrow(borrowable[next++]);
    if (s.moved == nullptr) break;
    lent->push_back(s.moved);
  }
}

}  // namespace gpushim
