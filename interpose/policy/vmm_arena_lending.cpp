// Lending in the vmm arena (VmmPoolOptions::alias_tails, vmm_arena.h): the idle free end of a
// partly used chunk, which can neither move nor be released, mapped a second time as the first or
// last chunk of a new block. A file of its own because it is the arena's one exception to "a
// physical chunk is mapped once": the walls it puts up (kLent where the end lies, kShadow over the
// rest of the second mapping), the conditions that keep queued work from reaching one memory
// through two addresses, and the retirement of second mappings all belong together, and nowhere
// else does the arena map a piece it already maps.
#include "policy/vmm_arena.h"

#include <algorithm>
#include <iterator>

namespace gpushim {

VmmArena::LentEnds VmmArena::lend_ends(const Plan& plan, uint64_t size) {
  LentEnds ends{nullptr, nullptr, plan.addr, plan.addr + size};
  const uintptr_t first = round_down(plan.addr, gran_), last = round_down(plan.addr + size - 1, gran_);
  auto unmapped = [&](uintptr_t c) {
    auto next = pieces_.lower_bound(c);
    return c + gran_ <= plan.res->end && (next == pieces_.end() || next->first >= c + gran_) &&
           (next == pieces_.begin() || std::prev(next)->first + std::prev(next)->second->size <= c);
  };
  if (plan.addr > first && unmapped(first)) {
    ends.head = lend(plan.addr - first, true, first, last + gran_);
    if (ends.head != nullptr) ends.fill_lo = first + gran_;
  }
  const uintptr_t end = plan.addr + size;
  if (!(ends.head != nullptr && last == first) && end < last + gran_ && unmapped(last)) {
    ends.tail = lend(end - last, false, first, last + gran_);
    if (ends.tail != nullptr) ends.fill_hi = last;
  }
  return ends;
}

VmmArena::Piece* VmmArena::lend(uint64_t offset, bool tail, uintptr_t skip_lo, uintptr_t skip_hi) {
  // Candidates are free blocks the build may take in (idle, or freed on the requesting stream:
  // make_plan's rule) that cover a chunk's tail from at most `offset` on (tail), or
  // its head up to at least `offset` (head), while something else lies in the rest of the chunk:
  // such a chunk can neither move nor be released. The tightest fit is taken, so that larger
  // free parts stay for larger needs. The chunk must be one whole piece, not itself a second
  // mapping, and lend only once per side; with alias_walled_ends_only, the free block must not
  // go on into the neighbouring chunk (lendable_end).
  Block* best = nullptr;
  uint64_t best_len = 0;
  for (Block* f : free_) {
    const uintptr_t fe = f->addr + f->size;
    uintptr_t lo, hi;
    if (tail) {
      if (f->addr % gran_ > offset || !lendable_end(f, true)) continue;
      lo = f->addr;
      hi = round_up(f->addr, gran_);
    } else {
      if (fe % gran_ < offset || !lendable_end(f, false)) continue;
      lo = round_down(fe, gran_);
      hi = fe;
    }
    if ((best != nullptr && hi - lo >= best_len) || (lo < skip_hi && skip_lo < hi) || !reusable_in_place(f)) continue;
    if (!lendable_chunk(round_down(lo, gran_), lo, hi)) continue;
    best = f;
    best_len = hi - lo;
  }
  if (best == nullptr) return nullptr;
  free_.erase(best);
  const uintptr_t c = tail ? round_down(best->addr, gran_) : round_down(best->addr + best->size - 1, gran_);
  const uintptr_t lo = std::max<uintptr_t>(best->addr, c), hi = std::min<uintptr_t>(best->addr + best->size, c + gran_);
  // The free block keeps [lo, hi); what lies outside stays free.
  if (best->addr + best->size > hi) {
    auto* rest = new_block();
    rest->addr = hi;
    rest->size = best->addr + best->size - hi;
    rest->res = best->res;
    share_terms(best, rest);  // freed with it: perhaps on a stream whose work is still queued
    blocks_.emplace(rest->addr, rest);
    insert_free(rest);
  }
  if (best->addr < lo) split_off_head(best, lo);
  // A wall now, keeping its terms: undo_lend puts it back as it was, and forget_streams reaches it
  // (a stream it names may be destroyed meanwhile). It returns idle once the block it was lent to
  // is idle and free (retire_aliases): that block's work ran after this memory's on its stream.
  best->addr = lo;
  best->size = hi - lo;
  best->state = State::kLent;
  Piece* owner = pieces_.at(c);
  auto* alias = new Piece{owner->handle, gran_, 0, nullptr};
  alias->alias_of = owner;
  alias->lent = best;
  return alias;
}

std::vector<uintptr_t> VmmArena::borrowable_chunks(uintptr_t lo, uintptr_t hi) {
  // Memory a stream freed while its work on it is still queued cannot move (unmapping does not wait
  // for that work) but is that stream's to reuse: mapped a second time under the new block, it
  // serves the build at once, and the old address stays a wall until the new block is idle and
  // free (retire_aliases), so no queued work reaches one memory through two addresses out of order.
  std::vector<uintptr_t> out;
  // (Slots of new memory larger than a chunk, VmmPoolOptions::piece, cannot take a borrowed one.)
  if (build_req_ == nullptr || !alias_ok_ || backend_.capture_active() || opt_.piece > gran_) return out;
  // Every block of a run is asked whether it is idle (an event recorded for it if need be), as
  // movable_pieces asks its runs'.
  for_each_free_run([&](Block* b) { return reusable_in_place(b) && (idle(b), true); },
                    [&](uintptr_t start, uintptr_t end) {
                      for (const Piece* pc : whole_pieces(start, end, lo, hi)) {
                        if (pc->alias_of != nullptr || pc->size != gran_) continue;
                        bool any_queued = false;  // an idle chunk is movable_pieces' to move
                        for (Block* q = containing(pc->va); q != nullptr && q->addr < pc->va + pc->size; q = after(q))
                          any_queued |= !idle(q);
                        if (any_queued) out.push_back(pc->va);
                      }
                    });
  // Highest first, as movable_pieces: mapped memory compacts toward the bottom.
  std::reverse(out.begin(), out.end());
  return out;
}

VmmArena::Piece* VmmArena::borrow(uintptr_t c) {
  const uintptr_t end = c + gran_;
  // A block ordered by its event alone (freed on a program-made context's legacy stream) keeps
  // that event: the wall below would drop it and could name no stream to record on again.
  for (Block* q = containing(c); q != nullptr && q->addr < end; q = after(q))
    if (q->state != State::kFree || !reusable_in_place(q) || (q->stream == event_ordered_mark() && !idle(q)))
      return nullptr;
  // One wall over the chunk. Its blocks are idle or freed on the request's stream: the wall names
  // that stream (its event recorded when first needed, after all of theirs); what lies outside the
  // chunk stays free on its own terms.
  Block* wall = containing(c);
  free_.erase(wall);
  if (wall->addr < c) split_off_head(wall, c);
  if (wall->addr + wall->size > end) split_off_tail(wall, end);
  CUstream stream = wall->stream;
  rules_.clear(wall);
  while (wall->addr + wall->size < end) {
    Block* n = after(wall);
    free_.erase(n);
    if (n->addr + n->size > end) split_off_tail(n, end);
    if (n->stream != nullptr) stream = n->stream;
    rules_.clear(n);
    blocks_.erase(n->addr);
    wall->size += n->size;
    recycle(n);
  }
  wall->stream = stream;
  wall->state = State::kLent;
  (void)idle(wall);  // its event recorded now: the work before its frees, which complete_move waits for
  Piece* owner = pieces_.at(c);
  auto* alias = new Piece{owner->handle, gran_, 0, nullptr};
  alias->alias_of = owner;
  alias->lent = wall;
  ++stats_.borrows;
  moved_since_growth_ += gran_;  // a move like stitching's, under the same remap budget
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

bool VmmArena::lendable_end(const Block* f, bool tail) const {
  const uintptr_t fe = f->addr + f->size;
  if (tail) {
    if (f->addr % gran_ == 0) return false;
    const uintptr_t edge = round_up(f->addr, gran_);
    return opt_.alias_walled_ends_only ? fe == edge : fe >= edge;
  }
  if (fe % gran_ == 0) return false;
  const uintptr_t edge = round_down(fe, gran_);
  return opt_.alias_walled_ends_only ? f->addr == edge : f->addr <= edge;
}

void VmmArena::lendable(uint64_t* min_tail, uint64_t* max_head) {
  // lend()'s candidates, summarized: what the most permissive tail and head would allow.
  for (Block* f : free_) {
    const uintptr_t fe = f->addr + f->size;
    const uint64_t x = f->addr % gran_, y = fe % gran_;
    // A free block may be both: a tail of the chunk it starts in and a head of the one it ends in
    // (not with alias_walled_ends_only: it would go on past the edge on either side).
    bool tail = lendable_end(f, true) && (*min_tail == 0 || x < *min_tail);
    bool head = lendable_end(f, false) && y > *max_head;
    if ((!tail && !head) || !reusable_in_place(f)) continue;
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

bool VmmArena::map_lent(Piece* p, uintptr_t va, Reservation* res, Block** run, std::vector<uintptr_t>* runs) {
  if (backend_.map(va, p->size, p->handle, 0) != CUDA_SUCCESS) {
    undo_lend(p);
    return false;
  }
  ++maps_;
  ++stats_.aliases;
  mapped_ += p->size;
  alias_bytes_ += p->size;
  p->va = va;
  p->res = res;
  ++res->pieces;
  pieces_.emplace(va, p);
  aliases_.push_back(p);
  // The lent part keeps its offset in the chunk; the shadow is the rest of the chunk (none when
  // the whole chunk is lent: borrow).
  const uintptr_t own = va + (p->lent->addr - p->alias_of->va), own_end = own + p->lent->size;
  if (p->lent->size < p->size) {
    Block* shadow = new_block();
    shadow->addr = own == va ? own_end : va;
    shadow->size = p->size - p->lent->size;
    shadow->res = res;
    shadow->state = State::kShadow;
    blocks_.emplace(shadow->addr, shadow);
    p->shadow = shadow;
  }
  // The lent memory may have been freed on the request's stream with work still queued: what the
  // new block leaves of it, through this mapping, is reusable on the same terms only. It is a free
  // block of its own (merge_built joins it to the new block), the runs beside it stay idle.
  if (p->lent->stream == nullptr) {
    add_to_run(res, own, p->lent->size, run, runs);
    return true;
  }
  *run = nullptr;
  add_to_run(res, own, p->lent->size, run, runs);
  share_terms(p->lent, *run);
  *run = nullptr;
  return true;
}

bool VmmArena::complete_move(Piece* a) {
  Piece* owner = a->alias_of;
  Block* wall = a->lent;
  if (backend_.unmap(owner->va, owner->size) != CUDA_SUCCESS) return false;
  ++unmaps_;
  mapped_ -= owner->size;
  alias_bytes_ -= owner->size;
  // The old range becomes a hole; the piece lives at the second mapping's address from now on.
  rules_.clear(wall);
  blocks_.erase(wall->addr);
  recycle(wall);
  pieces_.erase(owner->va);
  --owner->res->pieces;
  owner->va = a->va;
  owner->res = a->res;
  pieces_[a->va] = owner;
  ++stats_.pieces_moved;
  delete a;
  return true;
}

void VmmArena::retire_aliases() {
  if (backend_.capture_active()) return;  // unmapping may wait for the device: not now
  bool any = false;
  for (size_t i = 0; i < aliases_.size();) {
    Piece* a = aliases_[i];
    // A borrowed chunk moves for good once the work queued on its old address is done: the old
    // mapping goes, and the wall with it, instead of lasting as long as the block it serves.
    if (a->shadow == nullptr && idle(a->lent) && complete_move(a)) {
      aliases_[i] = aliases_.back();
      aliases_.pop_back();
      any = true;
      continue;
    }
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
    if (a->shadow != nullptr) insert_free(a->shadow);
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

}  // namespace gpushim
