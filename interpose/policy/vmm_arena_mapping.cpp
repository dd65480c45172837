// Carrying out a build of the vmm arena (vmm_arena.h): the plan that vmm_arena_planning.cpp made
// becomes a block by reserving virtual space, creating the pieces nothing free can supply, moving
// idle free pieces from elsewhere and mapping everything at its slot; and, the other way, pieces
// unmapped and given back to the driver (release_idle) and virtual ranges freed once empty. A
// file of its own because every driver call the arena makes to change its mappings is here, with
// the order that keeps a failure cheap to undo (virtual space, then new memory, then moves) and
// the undoing itself, apart from the decisions of where and what (planning) so that either can
// change without the other.
#include "policy/vmm_arena.h"

#include <algorithm>

namespace gpushim {

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
  std::vector<Piece*> movable;
  std::vector<uintptr_t> borrowable;
  if (!pieces_to_move(plan, size, attempt, &movable, &borrowable, err)) return nullptr;
  // 1. Virtual space first: it costs no memory, and its failure leaves nothing to undo.
  if (!reserve_for(&plan, size, err, replan)) return nullptr;
  // 2. What goes where: lent ends, free pieces from elsewhere where they fit, new ones for the rest.
  std::vector<Slot> slots;
  std::vector<Piece*> lent;
  plan_slots(plan, size, movable, borrowable, &slots, &lent);
  // 3. New physical memory next: if the device or the cap refuses it, nothing has moved yet.
  std::vector<Piece*> fresh;
  if (!create_pieces(slots, lent, attempt, &fresh, err)) return nullptr;
  // 4. Unmap the pieces that move, and map every piece at its slot.
  if (!map_slots(plan.res, slots, fresh, err)) return nullptr;
  // 5. [addr, addr + size) is now covered by free blocks the request may use: one block.
  Block* first = merge_built(plan.addr, size);
  count_build(slots, size);
  return first;
}

bool VmmArena::reserve_for(Plan* plan, uint64_t size, CUresult* err, bool* replan) {
  const uint64_t reserve = std::max(round_up(size, gran_), round_up(opt_.reserve, gran_));
  if (plan->res == nullptr) {
    plan->res = reserve_range(reserve, 0, err);
    if (plan->res == nullptr) return false;
    plan->res->cls = plan->cls;
    plan->addr = plan->res->base;
    return true;
  }
  if (plan->extend == 0) return true;
  Reservation* r = plan->res;
  const uint64_t n = std::max(plan->extend, reserve);
  uintptr_t va = 0;
  *err = backend_.va_reserve(n, r->end, &va);
  if (*err != CUDA_SUCCESS) return false;
  ++stats_.va_reserves;
  if (va != r->end) {
    // Something else took the range after the reservation: the range given instead is kept as a
    // reservation of its own, and the caller plans again.
    r->extendable = false;
    auto* fresh = new Reservation;
    fresh->base = va;
    fresh->end = va + n;
    fresh->parts.emplace_back(va, n);
    fresh->cls = r->cls;
    reservations_.emplace(va, fresh);
    *replan = true;
    return false;
  }
  r->parts.emplace_back(va, n);
  r->end += n;
  ++stats_.extensions;
  return true;
}

bool VmmArena::create_pieces(const std::vector<Slot>& slots, const std::vector<Piece*>& lent, Attempt* attempt,
                             std::vector<Piece*>* fresh, CUresult* err) {
  uint64_t new_bytes = 0;
  for (const Slot& s : slots) new_bytes += s.moved ? 0 : s.size;
  // Nothing is made: the lent ends go back, and so does a reservation left empty.
  auto give_up = [&](CUresult why) {
    for (Piece* a : lent) undo_lend(a);
    free_empty_reservations();
    *err = why;
    return false;
  };
  // (Pieces larger than a chunk may not fit the holes even when enough bytes are free.)
  if (!attempt->may_create) {
    attempt->new_bytes += new_bytes;
    if (attempt->new_bytes > 0) return give_up(CUDA_ERROR_NOT_READY);
  }
  // All or nothing, decided before the first piece: a request larger than the device can hold now
  // (an out-of-memory probe asks for more than the device) took every free byte of it, one piece
  // at a time, before the last piece failed and all went back (a 16 GiB device: 267 ms, and other
  // processes saw it full meanwhile). CUDA refuses such a cuMemAlloc at once.
  if (new_bytes > 0 && new_bytes > backend_.creatable_bytes()) return give_up(CUDA_ERROR_OUT_OF_MEMORY);
  for (const Slot& s : slots) {
    if (s.moved) continue;
    uint64_t handle = 0;
    if (const CUresult refused = backend_.physical_create(s.size, &handle); refused != CUDA_SUCCESS) {
      for (Piece* p : *fresh) release_piece_memory(p);
      return give_up(refused);
    }
    ++creates_;
    moved_since_growth_ = 0;
    held_ += s.size;
    peak_held_ = std::max(peak_held_, held_);
    fresh->push_back(new Piece{handle, s.size, 0, nullptr});
  }
  return true;
}

bool VmmArena::map_slots(Reservation* res, const std::vector<Slot>& slots, const std::vector<Piece*>& fresh,
                         CUresult* err) {
  // Consecutive slots become one free block (kept out of the free set: merge_built merges it into
  // the new block).
  size_t next_fresh = 0;
  bool complete = true;
  CUresult failure = CUDA_SUCCESS;
  Block* run = nullptr;
  std::vector<uintptr_t> runs;
  for (const Slot& s : slots) {
    Piece* p = s.moved ? s.moved : fresh[next_fresh++];
    if (s.moved != nullptr && s.moved->alias_of != nullptr) {
      if (!map_lent(p, s.va, res, &run, &runs)) complete = false;
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
    p->res = res;
    ++res->pieces;
    pieces_.emplace(s.va, p);
    add_to_run(res, s.va, p->size, &run, &runs);
  }
  free_empty_reservations();
  if (complete) return true;
  // Whatever was mapped is free memory like any other: into the free set, merged with its
  // neighbours (looked up by address, as a merge may have swallowed a later run).
  for (uintptr_t a : runs) {
    Block* b = containing(a);
    if (b != nullptr && free_.count(b) == 0) insert_free(coalesce(b));
  }
  *err = failure != CUDA_SUCCESS ? failure : CUDA_ERROR_UNKNOWN;
  return false;
}

void VmmArena::add_to_run(Reservation* res, uintptr_t addr, uint64_t size, Block** run, std::vector<uintptr_t>* runs) {
  if (*run != nullptr && (*run)->addr + (*run)->size == addr) {
    (*run)->size += size;
    return;
  }
  Block* b = new_block();
  b->addr = addr;
  b->size = size;
  b->res = res;
  b->state = State::kFree;
  blocks_.emplace(b->addr, b);
  runs->push_back(b->addr);
  *run = b;
}

VmmArena::Block* VmmArena::merge_built(uintptr_t addr, uint64_t size) {
  // The first and last free blocks may stick out of [addr, addr + size). When every block taken in
  // is idle, the last one is merged whole and split() trims it (from the top for sizes that
  // outlive troughs), as the idle-only pool always did. When some were freed on the request's
  // stream with work still queued (make_plan), the block is exactly [addr, addr + size): what
  // sticks out keeps its own terms, and no part of the queued memory is left over as idle.
  const uintptr_t end = addr + size;
  bool queued = false;
  for (Block* q = containing(addr); q != nullptr && q->addr < end; q = after(q)) queued |= q->stream != nullptr;
  Block* first = containing(addr);
  free_.erase(first);
  if (first->addr < addr) split_off_head(first, addr);
  if (queued && first->addr + first->size > end) split_off_tail(first, end);
  rules_.clear(first);
  while (first->addr + first->size < end) {
    Block* n = after(first);
    free_.erase(n);
    if (queued && n->addr + n->size > end) split_off_tail(n, end);
    rules_.clear(n);
    blocks_.erase(n->addr);
    first->size += n->size;
    recycle(n);
  }
  return first;  // with nothing queued, split() trims what sticks out at the end
}

void VmmArena::split_off_head(Block* b, uintptr_t start) {
  auto* head = new_block();
  head->addr = b->addr;
  head->size = start - b->addr;
  head->res = b->res;
  share_terms(b, head);
  blocks_.erase(b->addr);
  b->addr = start;
  b->size -= head->size;
  blocks_.emplace(head->addr, head);
  blocks_.emplace(start, b);
  insert_free(head);
}

void VmmArena::split_off_tail(Block* b, uintptr_t end) {
  auto* tail = new_block();
  tail->addr = end;
  tail->size = b->addr + b->size - end;
  tail->res = b->res;
  share_terms(b, tail);
  b->size -= tail->size;
  b->state = State::kAllocated;  // taken: the tail must not merge back into it
  blocks_.emplace(tail->addr, tail);
  // The tail of a build's last page may touch a free block that was not part of the build.
  insert_free(coalesce(tail));
}

void VmmArena::count_build(const std::vector<Slot>& slots, uint64_t size) {
  ++stats_.builds;
  uint64_t mapped_here = 0;
  bool moved = false;
  for (const Slot& s : slots) {
    mapped_here += s.size;
    moved |= s.moved != nullptr;
  }
  if (mapped_here < size) ++stats_.grows_in_place;
  if (moved) ++stats_.stitches;
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

}  // namespace gpushim
