// The large-block part of GPUSHIM_POLICY=vmm (vmm_pool.h puts the parts together): blocks of
// physical memory that the pool maps itself with the driver's virtual-memory API.
//
// Three layers:
//   - Pieces: physical allocations (cuMemCreate), one 2 MiB chunk each by default. A piece is
//     indivisible: cuMemMap maps a handle only from offset 0 ("offset ... currently must be
//     zero", cuda.h, CUDA 13), so a piece is mapped whole, and it is the unit that can move.
//   - Reservations: virtual ranges (cuMemAddressReserve) in which pieces are mapped, leaving
//     unmapped holes wherever pieces were taken away. A reservation whose end is reached grows in
//     place by reserving the range right after it (the driver honours the address hint when free).
//   - Blocks: what callers get, as in the caching policy (best fit by size, split, coalesce with
//     free neighbours, reuse by CUDA's rules as reuse_rules.h states them for both pools). Blocks
//     are multiples of `round` (512 B; whole chunks with VmmPoolOptions::whole_chunks, and
//     always for sub-allocator segments), tile the mapped pieces exactly and never span a hole;
//     touching blocks are neighbours (an address index finds them), and neighbours may share a
//     chunk. A block placed over a hole maps every chunk it touches there, or, at its ends, a
//     second mapping of a partly used chunk whose free end covers what it needs (lending, see
//     VmmPoolOptions::alias_tails). Blocks up to small_class_max (0 by default: none) live in
//     reservations of their own. Blocks of sizes whose blocks outlive deep falls of live memory
//     (in training, what lives across the trough between steps) are taken from the top of the
//     highest free block that fits, the others from the bottom of the lowest (VmmPoolOptions::long_fall).
//
// What the virtual-memory API buys is that free memory is not stuck where it was freed. When no
// free block is large enough, the arena looks at every window (a run of free blocks the request may
// reuse in place - idle ones, and with VmmPoolOptions::stream_order_builds those freed on its own
// stream - and holes between live blocks, possibly continuing past its reservation's end) and picks the place that
// needs the fewest bytes mapped; the holes there are filled:
//   - first with idle free pieces taken from elsewhere, highest addresses first (stitching: free
//     memory scattered anywhere becomes one range, and mapped memory compacts toward the bottom,
//     so emptied reservations are freed and holes do not accumulate);
//   - then with new pieces, only for what free pieces cannot cover (growth in place: a free block
//     at a window's edge is extended by what it lacks).
//   - an unmapped chunk at either end of the block may instead be a partly used chunk mapped a
//     second time, when its free tail (for the block's head) or head (for its tail) covers what
//     the block uses of that chunk: lending, which counts as nothing to map in the plan;
//   - with VmmPoolOptions::stream_order_builds, a hole that idle pieces do not fill takes a whole
//     chunk the request's stream freed while its work there is still queued, mapped a second time
//     (borrowing): it cannot be unmapped yet, but it is that stream's to reuse; its old address
//     is a wall until that work is done, then unmapped (complete_move), and the chunk has moved.
// Live blocks never move: only pieces that lie wholly in idle free blocks are unmapped (an idle
// block has no pending event, so no queued work can touch it while it is unmapped).
// Lent ranges are idle when lent, and return only once the block's range in the second mapping
// is idle and free again (the second mapping is unmapped then), so no queued work can reach the
// same memory through both addresses.
//
// Why not whole chunks: rounding every block up to 2 MiB costs up to a chunk per live block, and
// real models hold hundreds of blocks under a chunk. Packed blocks cost at most the partly used
// chunks at the edges of free gaps: a chunk partly live can be neither moved nor released, but
// one whose blocks are all freed (and idle) can, wherever it lies. On the trace corpus this
// reserves 4-10% less than whole chunks plus a sub-allocator; on the synthetic
// tests/unit/fragmentation_workload.h (blocks of 1-64 MiB) whole chunks with the sub-allocator
// do about as well (utilization 0.983-0.997; packed with lending 0.983-0.992), so both stay options.
//
// The code is one class in one file per concern (each file's opening comment says why):
// vmm_arena.cpp the core (blocks, best fit, reuse safety, segments, figures), vmm_arena_planning.cpp
// (where a build goes, what fills its holes), vmm_arena_mapping.cpp (carrying a plan out with the
// driver, giving memory back), vmm_arena_lending.cpp (second mappings of free chunk ends), and
// VmmLifetimes (vmm_lifetimes.h: which sizes outlive troughs, for long_fall).
//
// Thread safety: every public member takes the arena's mutex. The arena never calls out to the
// small-request pool, so that pool may call in while holding its own lock; payload hooks run
// under the arena's mutex and must not call back.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "policy/reuse_rules.h"
#include "policy/vmm_lifetimes.h"
#include "util/futex_mutex.h"

namespace gpushim {

struct VmmPoolOptions {
  uint64_t round = 512;                     // every user block is a multiple of this (see whole_chunks)
  // Requests up to small_max (0: none) are sub-allocated by a CachingPool from `small_segment`
  // segments, those up to medium_max (0: none) from `medium_segment` segments; the segments are
  // whole-chunk arena blocks. Off by default: every request is an arena block of `round` bytes
  // (see whole_chunks), which reserves less on every trace of the corpus (issue 16, measured with
  // `gpushim-analyze replay`, peak reserved in MiB; with sub-allocation up to 1 / 8 MiB from 4 /
  // 8 MiB segments and whole-chunk large blocks, then without sub-allocation):
  //   cnn_train 176 -> 160, detection_infer 150 -> 138, finetune_adam 50 -> 46, lstm_train
  //   42 -> 38, segmentation_train 178 -> 170, serving 84 -> 76, transformer_train 52 -> 50.
  // Sub-allocated segments pin whole chunks while any small block lives in them; arena blocks
  // pin only the chunks they touch, and a chunk whose blocks are all freed can move.
  uint64_t small_max = 0;
  uint64_t small_segment = 4ull << 20;
  uint64_t medium_max = 0;
  uint64_t medium_segment = 8ull << 20;
  uint64_t reserve = 1ull << 30;            // virtual space reserved at a time (0: exactly what is mapped)
  // Size of one physical allocation, rounded down to the granularity; 0: one chunk (2 MiB). A
  // physical allocation maps only whole (cuMemMap's offset must be zero), so it is the unit that
  // can move: one chunk each costs a map call per chunk when memory is created or moved; larger
  // runs cost fewer calls but stay pinned while any block uses part of them. Measured on
  // tests/unit/fragmentation_workload.h (5 seeds): utilization 0.977-0.995 with 2 MiB, 0.960-0.978
  // with 4 MiB, 0.88-0.93 with 16 MiB, 0.83-0.90 unlimited, for about 2x, 7x and 14x fewer maps.
  uint64_t piece = 0;
  // cudaFree'd bytes gathered into one epoch before its fence is recorded (GPUSHIM_QUARANTINE),
  // in the arena and in the small-request pool alike (reuse_rules.h).
  uint64_t quarantine_bytes = 256ull << 10;
  // Bytes of free pieces that may be moved since the pool last created memory, as a multiple of
  // what it holds (at least 256 MiB; 0: no limit). Past it, a build creates memory instead of moving more (unless
  // the device refuses: then moving is the way to serve the request). In a loop whose blocks land
  // a little differently every iteration, a pool this tight would otherwise remap chunks in every
  // iteration forever; a little more memory lets the loop settle (see VmmPool tests).
  double remap_budget = 1.0;
  // Large blocks as whole chunks (the arena's first design) instead of multiples of `round`.
  // Whole chunks keep every chunk movable once its block is freed, but round each block up by up
  // to a chunk; packing `round`-sized blocks lets neighbours share a chunk and maps only the
  // chunks a block touches. Measured on the trace corpus (docs/benchmarks.md, issue 16).
  bool whole_chunks = false;
  // User blocks up to this size are placed in virtual ranges of their own, apart from larger
  // ones (0: one class), as PyTorch keeps a small and a large pool: small blocks pack together
  // instead of scattering over the chunks that larger blocks' edges share. Physical chunks move
  // between the classes freely. Peak reserved summed over the seven corpus traces (MiB), without
  // alias_tails: one class 678, up to 32 KiB 678, 64 KiB 676, 128 KiB 676, 256 KiB 672, 512 KiB
  // 684, 1 MiB 680, 2 MiB 688; with alias_tails: one class 666, 64 KiB 674, 128 KiB 672, 256 KiB
  // 676, 512 KiB 680, 1 MiB 678. With lending, the free ends of every partly used chunk serve
  // any block's ends, so keeping small blocks apart no longer pays: one class. Single traces
  // move by a chunk or two either way from one setting to the next: placement decides which
  // chunks end up partly used, and that is chaotic.
  uint64_t small_class_max = 0;
  // Blocks predicted to outlive a trough of live memory are placed at high addresses, the rest at
  // low ones. In a training loop, the parameters' gradients made in one step's backward pass (and
  // anything else kept across steps) live through the trough between steps while the next step's
  // activations are placed around them; freed in the middle of that step, they leave holes
  // scattered among its live activations, none large enough for the step's largest request, and
  // the pool grows. Taken from the top of the highest of the tightest free blocks that fit (the
  // 16 smallest, find_free's kMaxPick) while the others take the lowest, they gather at one end
  // and leave longer runs when freed.
  // Lifetimes are learned per size (tensors of one shape recur every step): a freed block during
  // whose life live bytes fell more than `long_fall` below their level just after its
  // allocation, and then rose more than `long_rise` above that low by its free (as a fraction of
  // their level at the free), votes for its size, any other freed block against; votes are kept
  // within -2..2, so a size follows its last two lifetimes (long_fall 0: off, plain best fit).
  // Until some size has voted, every request takes plain best fit (the lowest of the tightest):
  // with one population there is nothing to keep apart, and the lowest of the 16 tightest from
  // the start measured worse (detection_infer 138, transformer_train 50, lstm_train 338).
  // Measured on the corpus (peak reserved MiB, off -> on): segmentation_train 170 -> 164,
  // finetune_adam 1128 -> 1126, the other five unchanged. Every setting of fall 0.1-0.25 with
  // rise 0.4-0.6 measured keeps all seven within a chunk of these (segmentation_train 162-164,
  // finetune_adam 1126-1128, cnn_train 156-158); rise 0.3: lstm_train 340. Both halves are
  // needed: the voted sizes at the top with the others at plain best fit give segmentation_train
  // 166. Picking among 8 or 12 candidates: finetune_adam 1136-1140; 24, 48, 64: 1120-1128 (32:
  // segmentation_train 166; placement is chaotic from one setting to the next). Reservations of
  // their own for those blocks instead (a class, as small_class_max): segmentation_train
  // 164-172, finetune_adam 1150-1160 (docs/benchmarks.md).
  // The cost, once a size has voted: find_free reads up to 16 free blocks per request instead of
  // stopping at the first usable one, and every free does a binary search of the lows (replay
  // throughput on segmentation_train and finetune_adam about -18%, the learning alone -8%).
  double long_fall = 0.15;
  double long_rise = 0.5;
  // Lending the free ends of partly used chunks. A chunk whose live blocks leave an idle free
  // tail [x, 2 MiB) or head [0, y) can neither move nor be released, and what arrives may not fit
  // there: at the peak, those ends are most of the memory reserved beyond what is live. When a
  // build's first (or last) chunk is unmapped, that chunk is instead the partly used one mapped
  // a second time (a physical allocation may be mapped at several addresses): the block starts
  // at or after x in it (ends at or before y). This is preferred even to moving an idle free
  // piece there, which could serve any build, where an end serves only blocks' ends. The lent
  // range is a wall where it lies until the block's range in the second mapping is idle and free
  // again; the rest of the second mapping is a wall too (other blocks' bytes). Measured on the
  // corpus (peak reserved MiB, 2-class layout -> one class with lending): cnn_train 160 -> 156,
  // detection_infer 138 -> 136, transformer_train 50 -> 48, finetune_adam 46 -> 44, lstm_train
  // 38 -> 36, serving 76 -> 76, segmentation_train 164 -> 170 (docs/benchmarks.md). Lending
  // even where free pieces could fill the chunk instead, and make_plan's preference for the place
  // whose block covers the most memory already mapped (re-recorded corpus, before -> after):
  // finetune_adam 1134 -> 1128, lstm_train 334 -> 332, the other five unchanged.
  bool alias_tails = true;
  // Lend only a chunk end whose free block stops at the chunk's edge (a free tail that ends where
  // the chunk does, a free head that begins where it does), not the end of a free run that goes
  // on into the next chunk. Such a run is contiguous free memory that can serve a block in place;
  // lending its end cuts it in two, and the lent part stays a wall for as long as anything lives in
  // the second mapping (long-lived blocks built in a first step: for the run). Measured under
  // replay --gpu-time model with first_step_waits (this off -> on, peak reserved MiB, plain frees /
  // stream-ordered): transformer_train 48 / 48 -> 48 / 48, but 48 for plain frees in 16 of 25
  // settings of GPUSHIM_QUARANTINE 256 KiB-1 MiB x best-fit candidates 8-16 against 6 of 25;
  // segmentation_train 166 / 162 -> 162 / 164, cnn_train 156 / 156 -> 158 / 158, lstm_train
  // 332 / 338 -> 336 / 336, finetune_adam 1128 / 1138 -> 1132 / 1140; the GPU-recorded traces
  // within 10 MiB either way (h200_transformer_caching 2,248 -> 2,238, h100_transformer_caching
  // 2,306 -> 2,296, h200_steptime_vmm 2,298 -> 2,302). Every row keeps utilization >= 0.96. Off
  // with GPUSHIM_VMM_REUSE=idle, the pool that recorded the GPU traces.
  bool alias_walled_ends_only = true;
  // What a build may take in where it lies (a window's free blocks, and the free chunk ends it
  // borrows): free blocks the request may reuse in place, i.e. also those freed on its own stream
  // whose work is still queued (the stream runs that work before the new block's), or (false) only
  // idle ones. On a GPU the host runs ahead of the device, and in a training step most freed
  // memory is still queued when the next tensor is made: with idle blocks only, a build went
  // around them and mapped new memory. Pieces still move only when idle (unmapping does not wait
  // for queued work): a hole idle pieces do not fill borrows such a chunk instead, mapped a second
  // time, and the old mapping goes once the work there is done (borrowable_chunks, complete_move).
  // Measured under replay --gpu-time model (GPUSHIM_VMM_REUSE, docs/benchmarks.md): peak reserved
  // of the six GPU-recorded traces 2,524-2,876 -> 2,248-2,302 MiB (0.92-0.98x PyTorch's expandable
  // segments, utilization 0.986-0.992); lstm_train stream-ordered 464 -> 334. With it, a block
  // freed on a stream also joins the touching idle free memory that stream freed last
  // (VmmArena::joins_home), so that best fit sees the run as one block.
  bool stream_order_builds = true;
  // A request that no free block fits exactly, while blocks freed with cudaFree wait in a closed
  // epoch, waits for that epoch's fence and looks again instead of carving around them
  // (VmmArena::try_allocate says why). Off with GPUSHIM_VMM_REUSE=idle, the pool before 2026-11-27.
  bool wait_before_carve = true;
  // With wait_before_carve, until some block has outlived a trough of live memory (in a training
  // loop, the first step; VmmLifetimes::seen_trough), a request waits for the closed epochs'
  // fences even when a free block fits it exactly. The first step places what lives for the whole
  // run (parameters, optimizer states): an exact fit taken from an old free block while its
  // neighbours still wait behind their fence splits memory that would have become one free block,
  // and the long-lived blocks built next land on lent chunk ends around it (transformer_train, plain
  // frees, under replay --gpu-time model: 8 second mappings alive for the run, 50 MiB reserved for
  // 47.0 requested; docs/benchmarks.md). Later steps do not wait for an exact fit: by then the
  // layout of what lives long is set. A program that shows no trough (inference) keeps waiting so;
  // on the corpus that cost 0-5% more fence waits and no synchronization. Measured with
  // alias_walled_ends_only (this off -> on, peak reserved MiB, plain frees): transformer_train
  // 50 -> 48 (and in 16 of 25 settings, as there, against 10 of 25), finetune_adam 1128 -> 1132,
  // the others unchanged; stream-ordered frees are unchanged (no epochs).
  bool first_step_waits = true;
};

// Counters beyond PoolFigures, for tests and benchmarks.
struct VmmStats {
  uint64_t builds = 0;         // blocks made by mapping pieces into a window
  uint64_t grows_in_place = 0; // builds that reused free memory where it was and mapped only the rest
  uint64_t stitches = 0;       // builds that remapped free pieces from elsewhere
  uint64_t pieces_moved = 0;
  uint64_t aliases = 0;        // free chunk ends lent to a block's end through a second mapping
  uint64_t borrows = 0;        // whole chunks lent to a build (freed on its stream, work still queued)
  uint64_t extensions = 0;     // reservations extended in place through the address hint
  uint64_t va_reserves = 0;
  uint64_t va_frees = 0;
  uint64_t pieces = 0;         // physical allocations held now
  uint64_t reservations = 0;   // virtual ranges held now
};

class VmmArena {
 public:
  enum class Owner : uint8_t { kUser, kSegment };

  VmmArena(Backend& backend, const VmmPoolOptions& options);
  ~VmmArena();
  VmmArena(const VmmArena&) = delete;
  VmmArena& operator=(const VmmArena&) = delete;

  size_t granularity() const { return gran_; }

  // What an attempt may do, and what it would have needed when it returns CUDA_ERROR_NOT_READY
  // (kMemory): the caller can then take back memory cached in the small pool before trying again.
  enum class Need : uint8_t { kNothing, kMemory };
  struct Attempt {
    bool may_create = true;    // false: return kMemory instead of creating physical memory
    bool over_budget = false;  // move free pieces even past the remap budget (memory is short)
    Need need = Need::kNothing;
    uint64_t new_bytes = 0;    // with kMemory: about how much would have been created
  };
  // One attempt: best fit (again after collecting what became idle), then a build.
  // Returns CUDA_ERROR_OUT_OF_MEMORY when the device (or the cap) refuses the memory still needed;
  // the caller decides whether to make more memory reusable and retry.
  // With `hooks` (kUser blocks), hooks->on_allocated fills the block's payload under the lock.
  CUresult try_allocate(uint64_t size, const AllocRequest& req, Owner owner, void** out, uint64_t* got,
                        Attempt* attempt, PayloadHooks* hooks = nullptr);
  // Frees a kUser block (reuse_rules.h says when it can serve again). Unknown pointers:
  // CUDA_ERROR_INVALID_VALUE, or CUDA_ERROR_NOT_FOUND with `hooks`; CUDA_ERROR_NOT_PERMITTED when
  // hooks->on_freeing refused (the block stays live).
  CUresult deallocate(void* p, CUstream stream, bool stream_ordered, PayloadHooks* hooks = nullptr);
  // The payload of the live kUser block starting at `p`.
  bool find_payload(const void* p, BlockPayload* out) const;
  void live_user_blocks(std::vector<uintptr_t>* out) const;
  void with_lock(absl::FunctionRef<void()> fn) const {
    std::lock_guard<FutexMutex> lock(mu_);
    fn();
  }
  // DeviceMemoryResource::forget_streams, for the arena's free blocks and the lent ones (walls that
  // keep the terms of their free: they become free again).
  void forget_streams(absl::FunctionRef<bool(CUstream)> doomed) {
    std::lock_guard<FutexMutex> lock(mu_);
    rules_.forget_streams(doomed, [&](auto&& fn) {
      for (Block* b : free_) fn(b);
      for (Piece* a : aliases_) fn(a->lent);
    });
  }
  // Takes back a kSegment block; its owner guarantees that no work still uses it.
  CUresult return_segment(void* p);
  // Grows the kSegment block at `p` by `more` bytes (whole chunks) in place: the range after it
  // must be unmapped or idle free blocks of its reservation (or past its end, when the range
  // after can be reserved). Holes are filled as in a build. CUDA_ERROR_NOT_SUPPORTED when the
  // range is not free; an error of the driver's when it refuses memory.
  CUresult extend_segment(void* p, uint64_t more);
  // The kSegment block at `p` keeps its first `keep` bytes (whole chunks); the rest becomes free.
  CUresult shrink_segment(void* p, uint64_t keep);

  // The device was just synchronized by someone else: everything freed so far is idle.
  void settle_after_external_sync();
  // Without waiting: makes reusable what the device has finished with. True if anything was.
  bool collect_idle();
  // Unmaps and releases every piece that lies in an idle free block (call after a sync to make
  // all freed memory idle), and frees virtual ranges left without pieces. Nothing during capture.
  void release_idle();

  void count_retry();
  void count_oom();

  bool contains(const void* p) const;
  // A live user block containing `p` (not a sub-allocator segment); sets its start and size.
  bool find_user_block(const void* p, uintptr_t* base, uint64_t* size) const;
  // Fills reserved/cached/quarantine/largest/segment/retry/oom/sync/map figures for the arena
  // alone; `user_allocated` receives the bytes of live kUser blocks.
  void figures(PoolFigures* out, uint64_t* user_allocated, uint64_t* segment_bytes) const;
  VmmStats stats() const;
  // Checks every structural invariant; "" when they hold, else the first violation. O(n log n).
  std::string check_invariants() const;

 private:
  // kLent: the free end of a partly used chunk, mapped a second time under another block (see
  // Piece::alias_of); kShadow: the part of that second mapping that other blocks' bytes occupy.
  // Both are walls: neither free nor handed out.
  enum class State : uint8_t { kAllocated, kFree, kWaiting, kLent, kShadow };
  struct Reservation {
    uintptr_t base = 0;
    uintptr_t end = 0;  // one or more adjacent driver reservations, [base, end)
    std::vector<std::pair<uintptr_t, uint64_t>> parts;  // what va_free must be given back
    uint64_t pieces = 0;
    bool extendable = true;  // false once the driver refused the range right after `end`
    uint8_t cls = 0;         // size class of the blocks placed here (VmmPoolOptions::small_class_max)
  };
  struct Block;
  struct Piece {
    uint64_t handle = 0;
    uint64_t size = 0;
    uintptr_t va = 0;
    Reservation* res = nullptr;
    // A second mapping of alias_of's memory, made for an end of a block: only the range of the
    // chunk that `lent` covers is this mapping's; `shadow` covers the rest, at the same offsets
    // (VmmPoolOptions::alias_tails).
    Piece* alias_of = nullptr;
    Block* lent = nullptr;
    Block* shadow = nullptr;
  };
  struct Block {
    uintptr_t addr = 0;
    uint64_t size = 0;
    Reservation* res = nullptr;  // blocks never span reservations (nor unmapped space)
    State state = State::kFree;
    Owner owner = Owner::kUser;
    CUstream stream = nullptr;    // stream-ordered frees: the stream it was freed on
    // Stream-ordered frees: the stream that freed this memory last, kept once its work there is
    // done and `stream` is cleared (coalesce, joins_home). Null: never freed on a stream, or
    // parts freed on different ones.
    CUstream home = nullptr;
    ReuseEvent* event = nullptr;  // completes when the work before that free is done
    BlockPayload payload;         // the caller's, while allocated through try_allocate's hooks
    // kUser blocks: allocation count and live bytes just after the allocation (long_fall).
    uint64_t born = 0;
    uint64_t born_live = 0;
  };
  // Class first: each class's free blocks are one contiguous run of the set.
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      if (a->res->cls != b->res->cls) return a->res->cls < b->res->cls;
      return a->size != b->size ? a->size < b->size : a->addr < b->addr;
    }
  };
  // B-trees rather than red-black trees: one node holds many blocks, so the split and merge of
  // every allocation and free rarely allocate (as in CachingPool).
  using FreeSet = absl::btree_set<Block*, BySizeThenAddress>;

  // Where a block of `size` will be made: [addr, addr + size) in `res`, today a run of idle free
  // blocks and unmapped holes (a "window"); the holes are filled with pieces.
  struct Slot {
    uintptr_t va;
    uint64_t size;
    Piece* moved;  // null: a new piece of `size`
  };
  struct Plan {
    uint8_t cls = 0;             // size class of the block (and of a new reservation)
    Reservation* res = nullptr;  // null: a new reservation
    uintptr_t addr = 0;
    uint64_t hole_bytes = 0;     // what must be mapped
    uint64_t extend = 0;         // bytes needed past res->end (extension through the address hint)
  };
  // The ends of a build lent by partly used chunks (lending), and the range between them that
  // plan_fill fills.
  struct LentEnds {
    Piece* head = nullptr;
    Piece* tail = nullptr;
    uintptr_t fill_lo = 0, fill_hi = 0;
  };

  static uint64_t round_up(uint64_t v, uint64_t m) { return v > UINT64_MAX - (m - 1) ? 0 : (v + m - 1) / m * m; }
  static uint64_t round_down(uint64_t v, uint64_t m) { return v / m * m; }

  // --- The core (vmm_arena.cpp): blocks, best fit, reuse safety, segments, figures. ---
  uint8_t class_of(uint64_t size, Owner owner) const {
    return owner == Owner::kUser && size <= opt_.small_class_max ? 0 : 1;
  }
  // Where find_free takes a block from (VmmPoolOptions::long_fall): the tightest fit, or among
  // the kMaxPick tightest the lowest (kLow) or highest (kHigh) one.
  enum class Fit : uint8_t { kBest, kLow, kHigh };
  Fit fit_for(uint64_t size, Owner owner) const {
    if (owner != Owner::kUser || !lifetimes_.any_votes()) return Fit::kBest;
    return lifetimes_.outlives_troughs(size) ? Fit::kHigh : Fit::kLow;
  }
  Block* find_free(uint64_t size, uint8_t cls, const AllocRequest& req, Fit fit);
  // The first free block of class `cls` at least `size` large (end(): none).
  FreeSet::iterator first_fit(uint64_t size, uint8_t cls);
  // Is there a free block of exactly `size` in class `cls` (usable by the request or not)?
  bool exact_fit_free(uint64_t size, uint8_t cls);
  bool idle(Block* b) { return rules_.idle(b); }
  // May the build in progress take the free block `b` in where it lies? Idle ones, and ones the
  // request may reuse in place: freed on its own stream, whose queued work runs before the new
  // block's. (Moving a piece needs it idle: unmapping does not wait for queued work.)
  bool reusable_in_place(Block* b) { return build_req_ != nullptr ? rules_.usable(b, *build_req_) : idle(b); }
  bool collect_locked();
  void settle_locked();
  void release_waiting(std::vector<Block*>& blocks);
  Block* containing(uintptr_t va) const;
  Block* before(const Block* b) const;
  Block* after(const Block* b) const;
  // Keeps `size` bytes of `b` as the taken block, at its start or (from_top) at its end; the
  // rest becomes a free block of its own.
  Block* split(Block* b, uint64_t size, bool from_top = false);
  // Blocks are recycled: every allocation splits and every free merges, and a heap allocation
  // for each would be most of the cost of a small pair.
  Block* new_block();
  void recycle(Block* b);
  void insert_free(Block* b);
  Block* coalesce(Block* b);
  // May free neighbours `a` and `b`, one idle and the other freed on a stream whose work there is
  // still queued, become one block on the queued one's terms? (coalesce says why.)
  bool joins_home(const Block* a, const Block* b) const;
  // `to` was split from `from`: reusable on the same terms (ReuseRules::share), same home.
  void share_terms(const Block* from, Block* to) {
    rules_.share(from, to);
    to->home = from->home;
  }

  // --- Planning (vmm_arena_planning.cpp): where a build goes and what fills its holes. ---
  bool make_plan(uint64_t size, uint8_t cls, Plan* plan);
  std::vector<Piece*> movable_pieces(uintptr_t lo, uintptr_t hi);
  // run(start, end) for every maximal run of touching free blocks of one reservation that
  // `takes(block)` accepts and that spans at least a chunk, by address.
  template <typename Takes, typename Run>
  void for_each_free_run(Takes&& takes, Run&& run);
  // The pieces lying wholly in [start, end), but none overlapping [lo, hi), by address.
  std::vector<Piece*> whole_pieces(uintptr_t start, uintptr_t end, uintptr_t lo, uintptr_t hi) const;
  // The pieces a build at `plan` may move, and the chunks it may borrow (none of either past the
  // remap budget). False, with CUDA_ERROR_NOT_READY and attempt->new_bytes, when they cannot
  // cover the holes and the attempt may not create memory.
  bool pieces_to_move(const Plan& plan, uint64_t size, Attempt* attempt, std::vector<Piece*>* movable,
                      std::vector<uintptr_t>* borrowable, CUresult* err);
  // Every chunk of the build as a slot: lent ends first, then movable pieces, then borrowed
  // chunks, then new pieces.
  void plan_slots(const Plan& plan, uint64_t size, std::vector<Piece*>& movable,
                  const std::vector<uintptr_t>& borrowable, std::vector<Slot>* slots, std::vector<Piece*>* lent);
  void plan_fill(const Plan& plan, uint64_t size, std::vector<Piece*>& movable, std::vector<Slot>* slots) const;

  // --- Mapping (vmm_arena_mapping.cpp): builds, virtual ranges, pieces moved and released. ---
  Block* build(uint64_t size, uint8_t cls, Attempt* attempt, CUresult* err);
  // One build at `plan`; `replan` is set when the reservation could not be extended in place
  // (then a new plan is needed).
  Block* build_at(Plan plan, uint64_t size, Attempt* attempt, CUresult* err, bool* replan);
  // build_at's steps, in order; each returns false (with *err) when the build stops there.
  bool reserve_for(Plan* plan, uint64_t size, CUresult* err, bool* replan);
  bool create_pieces(const std::vector<Slot>& slots, const std::vector<Piece*>& lent, Attempt* attempt,
                     std::vector<Piece*>* fresh, CUresult* err);
  bool map_slots(Reservation* res, const std::vector<Slot>& slots, const std::vector<Piece*>& fresh, CUresult* err);
  Block* merge_built(uintptr_t addr, uint64_t size);
  // `b` (free, not in the free set) now starts at `start` (ends at `end`); what lay before (past)
  // it is a free block of its own, reusable on b's terms. split_off_tail marks `b` taken and
  // merges the tail with a free neighbour it may touch.
  void split_off_head(Block* b, uintptr_t start);
  void split_off_tail(Block* b, uintptr_t end);
  void count_build(const std::vector<Slot>& slots, uint64_t size);
  // Mapped pieces whose slots touch become one free block: `run` (the last one), listed in `runs`.
  void add_to_run(Reservation* res, uintptr_t addr, uint64_t size, Block** run, std::vector<uintptr_t>* runs);
  Reservation* reserve_range(uint64_t size, uintptr_t hint, CUresult* err);
  void carve_out(Piece* p);
  void release_piece_memory(Piece* p);
  void free_empty_reservations();

  // --- Lending (vmm_arena_lending.cpp): free chunk ends mapped a second time. ---
  // The ends of a build at `plan` that partly used chunks can lend (VmmPoolOptions::alias_tails).
  LentEnds lend_ends(const Plan& plan, uint64_t size);
  // A partly used chunk whose idle free tail starts at or before `offset` (tail) or whose idle
  // free head reaches at least `offset` (head): that part becomes kLent, and the returned Piece
  // (not yet mapped) maps the chunk again. Null when none. Nothing in [skip_lo, skip_hi) is lent.
  Piece* lend(uint64_t offset, bool tail, uintptr_t skip_lo, uintptr_t skip_hi);
  void undo_lend(Piece* alias);
  // Whole chunks a build for build_req_ may borrow (a second mapping, like a lent end) instead of
  // new memory: every block on them free and reusable in place by the request, at least one still
  // queued (an idle chunk is moved instead), none in [lo, hi). Highest addresses first.
  std::vector<uintptr_t> borrowable_chunks(uintptr_t lo, uintptr_t hi);
  // The chunk at `c` becomes one kLent wall and the returned Piece (not yet mapped) maps it again;
  // null when its blocks are no longer all free (a lent end took part of it meanwhile).
  Piece* borrow(uintptr_t c);
  // A borrowed chunk whose old address is idle: unmaps it there, and the second mapping becomes the
  // piece's only one. False (nothing changed) when the driver refused the unmap.
  bool complete_move(Piece* alias);
  // Maps the lent piece `p` at `va` in `res`, with its shadow; false (the lend undone) when the
  // driver refused.
  bool map_lent(Piece* p, uintptr_t va, Reservation* res, Block** run, std::vector<uintptr_t>* runs);
  // Is the free block `f` a chunk's free tail (tail) or head that lend may take, as far as `f`
  // itself goes? (VmmPoolOptions::alias_walled_ends_only.)
  bool lendable_end(const Block* f, bool tail) const;
  // May the chunk at `c` lend [lo, hi)? (lend's conditions on the chunk.)
  bool lendable_chunk(uintptr_t c, uintptr_t lo, uintptr_t hi) const;
  // The least offset at which a lendable free tail starts and the greatest one a lendable free
  // head reaches (0: none), for make_plan.
  void lendable(uint64_t* min_tail, uint64_t* max_head);
  // Unmaps second mappings whose own part is idle and free again; their lent ranges become free.
  void retire_aliases();

  Backend& backend_;
  const VmmPoolOptions opt_;
  const size_t gran_;
  const uint64_t unit_;  // user blocks are multiples of this: round (or gran_ with whole_chunks)
  mutable FutexMutex mu_;
  FreeSet free_;                      // free blocks, for best fit
  absl::btree_map<uintptr_t, Block*> blocks_;  // every block, by address: neighbours, windows
  ReuseRules<Block> rules_;  // holds the cudaFree'd blocks until their fence completes
  absl::flat_hash_map<uintptr_t, Block*> user_;      // live kUser blocks by address
  absl::flat_hash_map<uintptr_t, Block*> segments_;  // live kSegment blocks by address
  std::map<uintptr_t, Piece*> pieces_;               // mapped pieces by address
  std::map<uintptr_t, Reservation*> reservations_;   // by base
  std::vector<Piece*> loose_;  // unmapped pieces the driver refused to release; retried later
  uint64_t held_ = 0, peak_held_ = 0, mapped_ = 0, user_allocated_ = 0, segment_bytes_ = 0;
  uint64_t creates_ = 0, releases_ = 0, maps_ = 0, unmaps_ = 0, retries_ = 0, ooms_ = 0;
  uint64_t moved_since_growth_ = 0;  // bytes of pieces moved since memory was last created
  VmmStats stats_;
  std::vector<Block*> spare_;
  std::vector<Piece*> aliases_;  // second mappings (Piece::alias_of), until retire_aliases
  uint64_t alias_bytes_ = 0;     // mapped by them: virtual space only, no memory of their own
  bool alias_ok_ = false;        // the build in progress is for a user block
  // The request the build in progress serves: its windows may take in free blocks it may reuse in
  // place (freed on its own stream, work still queued), not only idle ones (make_plan).
  const AllocRequest* build_req_ = nullptr;
  static constexpr size_t kMaxSpareBlocks = 4096;
  VmmLifetimes lifetimes_;  // which sizes outlive troughs (VmmPoolOptions::long_fall)
};

template <typename Takes, typename Run>
inline void VmmArena::for_each_free_run(Takes&& takes, Run&& run) {
  auto it = blocks_.begin();
  while (it != blocks_.end()) {
    Block* b = it->second;
    ++it;
    if (b->state != State::kFree || !takes(b)) continue;
    const Reservation* res = b->res;
    const uintptr_t start = b->addr;
    uintptr_t end = b->addr + b->size;
    while (it != blocks_.end() && it->first == end && it->second->res == res && it->second->state == State::kFree &&
           takes(it->second)) {
      end += it->second->size;
      ++it;
    }
    if (end - start >= gran_) run(start, end);
  }
}

}  // namespace gpushim
