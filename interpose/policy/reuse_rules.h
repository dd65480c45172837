// When a freed block may be handed out again: the one statement of CUDA's reuse rules, shared by
// every pool (CachingPool, VmmArena), in the spirit of RMM's stream_ordered_memory_resource.
//
//   - cudaFreeAsync (stream-ordered): reusable at once by a stream-ordered request on the same
//     stream; anywhere else once an event recorded after the free has completed. The event is
//     recorded on first need, not at the free: most reuse is on the same stream and never needs
//     one, and recording later only waits for more work, never less.
//   - cudaFree (plain): real cudaFree synchronizes the device, so work issued before the free on
//     any stream may still use the block. Freed blocks gather into an epoch; when the epoch closes,
//     one device fence (an event on every stream in use, Backend::record_device_fence) is recorded
//     for all of them, and they become reusable once it has completed, as seen by a query that never
//     waits. An epoch closes when it holds `epoch_bytes`, or when a pool finds no free block that
//     fits (collect()). Fences complete in the order they were recorded (each stream runs in
//     order), so only the oldest open question is ever asked.
//   - When the device lags behind the host and freed memory still in use could serve a request,
//     a pool waits for the oldest epoch's fence (the work before those frees, not the whole
//     device) rather than grow: memory stays bounded by what the program holds. Counted (waits).
//   - The device is synchronized only when memory is really short (a pool's out-of-memory retry,
//     or an explicit release of cached memory), and every such synchronization is counted.
//   - While a graph is being captured nothing is synchronized, recorded or queried: a pool grows.
//   - A block never names a stream that may be gone (cuda/stream_registry.h states the rule): a
//     stream about to be destroyed has its blocks' event recorded first, and they are ordered by
//     that event alone from then on (forget_streams); so are blocks freed on the per-thread default
//     stream, whose handle names another stream in every thread (their event is recorded at the
//     free, by the freeing thread).
//
// Blocks are the pool's: a Block has `CUstream stream` (null: ready for anyone) and
// `ReuseEvent* event`. Blocks waiting for a fence are held here, in epochs, until released back to
// the pool. Not thread-safe: used under the owning pool's lock.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <algorithm>
#include <atomic>
#include <deque>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "policy/backend.h"
#include "policy/device_memory_resource.h"
#include "policy/stream_handles.h"

namespace gpushim {

// An event shared by the pieces of one stream-ordered free (a split keeps the parts together).
struct ReuseEvent {
  uint64_t handle = 0;
  uint32_t refs = 1;
};

template <typename Block>
class ReuseRules {
 public:
  ReuseRules(Backend& backend, uint64_t epoch_bytes)
      : backend_(backend), foreign_possible_(*backend.foreign_streams_possible()), epoch_bytes_(epoch_bytes) {}
  ~ReuseRules() {
    for (Epoch& e : sealed_)
      if (e.fence != 0) backend_.release_fence(e.fence);
  }
  ReuseRules(const ReuseRules&) = delete;
  ReuseRules& operator=(const ReuseRules&) = delete;

  // The one decision every pool makes when a block is freed. A stream-ordered free is free at
  // once (reusable on its stream, elsewhere once its event completes): true, the caller puts the
  // block in its free set. A plain cudaFree, and any free during a capture (it belongs to the
  // graph being built), waits for its epoch's fence: false, the block is held here.
  bool retire(Block* b, CUstream stream, bool stream_ordered) {
    if (stream_ordered && !backend_.capture_active() && freed_on_stream(b, stream)) return true;
    // During a capture elsewhere (a free on a capturing stream never reaches a pool: the core asks
    // CUDA whether the stream captures), a created stream is kept as at any other time: that takes
    // no driver call, and the block is reusable on that stream at once. Held for a fence instead,
    // nothing freed during a capture came back before it ended: another thread's loop on its own
    // stream ran out of memory behind a long capture (e2e capture_elsewhere), and a block of a
    // context the program made went back at the next synchronization, which covers the pool's
    // context only, while that stream still used it (e2e foreign_ctx_capture_free*). The default
    // streams need an event recorded now (freed_on_stream): such a block waits for its fence.
    if (stream_ordered && names_created_stream(stream)) {
      drop_event(b);
      b->stream = stream;
      return true;
    }
    hold(b);
    return false;
  }

  // ---- stream-ordered frees ----
  // False when `b` must wait for a fence instead (see retire).
  bool freed_on_stream(Block* b, CUstream stream) {
    drop_event(b);
    stream = normalize_stream(stream);
    // A stream of a context the program made: the pool's synchronization does not cover it
    // (synchronized_idle). A created stream is one context's, so its handle still names it: the
    // block keeps it, a request on that stream reuses the block at once, as on any stream, and an
    // event is recorded on need, in the stream's context (record_on). (Ordered by an event alone,
    // a program working in its own context held a block per step while the device lagged, and
    // failed once memory ran short: e2e program_ctx_only.) A default stream's handle names the
    // pool context's own: the block is ordered by an event recorded there now, alone; failing
    // that, a fence.
    if (names_created_stream(stream)) {
      if (foreign(stream, nullptr)) {
        b->stream = stream;
        return true;
      }
    } else if (uint64_t e = 0; foreign(stream, &e)) {
      if (e == 0) return false;
      b->event = new ReuseEvent{e, 1};
      b->stream = event_ordered_mark();
      return true;
    }
    if (stream == CU_STREAM_PER_THREAD) {
      // Only this thread can name its per-thread stream: its event is recorded now. Failing that,
      // a device fence covers it (its legacy-stream event waits for per-thread default streams).
      const uint64_t e = backend_.record_event(stream);
      if (e == 0) return false;
      b->event = new ReuseEvent{e, 1};
      stream = event_ordered_mark();
    }
    b->stream = stream;
    return true;
  }
  // Streams for which `doomed` is true are about to be destroyed (or their context is): each free
  // block `for_each_free(fn)` visits that names one gets an event recorded now, while the stream
  // exists (one per stream, shared), and is ordered by it alone from then on. A block whose event
  // cannot be recorded (during a capture, unless it is another context's stream, not capturing)
  // waits for the next device synchronization.
  template <typename ForEachFree>
  void forget_streams(absl::FunctionRef<bool(CUstream)> doomed, ForEachFree&& for_each_free) {
    std::vector<std::pair<CUstream, ReuseEvent*>> recorded;
    for_each_free([&](Block* b) {
      if (!names_created_stream(b->stream) || !doomed(b->stream)) return;
      if (b->event == nullptr) {
        auto it = std::find_if(recorded.begin(), recorded.end(), [&](const auto& r) { return r.first == b->stream; });
        if (it == recorded.end()) {
          // During a capture only in another context, whose stream is not capturing (its event
          // is then no node of a graph): the pool's synchronization does not cover that stream,
          // and without an event it released the block while the stream's last work still ran
          // (e2e foreign_ctx_capture_destroy*).
          uint64_t e = 0;
          if (!backend_.capture_active()) e = record_on(b->stream);
          else if (!foreign(b->stream, &e)) e = 0;
          recorded.emplace_back(b->stream, e == 0 ? nullptr : new ReuseEvent{e, 0});
          it = std::prev(recorded.end());
        }
        if (it->second != nullptr) {
          b->event = it->second;
          ++b->event->refs;
        }
      }
      b->stream = event_ordered_mark();
    });
  }
  // May `b` (free) serve `req` now?
  bool usable(Block* b, const AllocRequest& req) {
    if (b->stream == nullptr) return true;
    // The same stream, unless the request names the legacy stream from another context: that is
    // the other context's own. (A created stream is one context's, whichever context the block
    // was freed from; see freed_on_stream.)
    if (req.stream_ordered && same_stream(b->stream, normalize_stream(req.stream)) &&
        (b->stream != CU_STREAM_LEGACY || !foreign(CU_STREAM_LEGACY, nullptr)))
      return true;
    // Freed on a default stream of a context the program made (its event alone orders it), and
    // asked for on that stream again (that context's legacy stream, or this thread's per-thread
    // one there): after the free in that stream's order.
    if (req.stream_ordered && b->stream == event_ordered_mark() && b->event != nullptr &&
        foreign_possible_.load(std::memory_order_acquire)) {
      const CUstream s = normalize_stream(req.stream);
      if ((s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) && backend_.event_on_callers_stream(b->event->handle, s))
        return true;
    }
    return idle(b);
  }
  // Has all work queued before `b`'s free completed? Then `b` becomes ready for anyone.
  bool idle(Block* b) {
    if (b->stream == nullptr) return true;
    if (backend_.capture_active()) return false;
    if (b->event == nullptr) {
      if (b->stream == event_ordered_mark()) return false;  // no stream to record on: a synchronization releases it
      const uint64_t e = record_on(b->stream);
      if (e == 0) return false;
      b->event = new ReuseEvent{e, 1};
    }
    if (!backend_.event_done(b->event->handle)) return false;
    clear(b);
    return true;
  }
  // `to` was split from `from`: freed together, so reusable under the same terms.
  void share(const Block* from, Block* to) {
    to->stream = from->stream;
    to->event = from->event;
    if (to->event) ++to->event->refs;
  }
  // May free neighbours `a` and `b` become one block? Only when reusing the merged block is as
  // safe as reusing either: both ready for anyone, or both freed on the same stream.
  static bool mergeable(const Block* a, const Block* b) {
    if (a->stream == nullptr && b->stream == nullptr) return true;
    return a->stream && b->stream && same_stream(a->stream, b->stream);
  }
  // mergeable(), after asking (without waiting) whether a tagged one is idle by now: a block freed
  // on a stream next to one ready for anyone merges once its stream has finished with it. Each
  // ask may record an event: a pool on the allocation path merges with mergeable() alone and
  // settles the rest in batches (settle).
  bool mergeable_now(Block* a, Block* b) {
    if (mergeable(a, b)) return true;
    if (a->stream != nullptr && !idle(a)) return false;
    if (b->stream != nullptr && !idle(b)) return false;
    return mergeable(a, b);
  }
  // Asks, without waiting, which of the free `blocks` are idle by now, as idle() would, but with
  // one event per stream (shared by that stream's blocks that have none: recorded now, it waits
  // for at least the work before each of their frees) and one query per event. The idle ones
  // become ready for anyone and stay in `blocks`; the rest are removed from it.
  void settle(std::vector<Block*>& blocks) {
    if (backend_.capture_active()) {
      blocks.clear();
      return;
    }
    std::vector<std::pair<CUstream, ReuseEvent*>> recorded;
    for (Block* b : blocks) {
      // An event may be recorded now (by any thread) on a created stream or the legacy one.
      if (b->event != nullptr || !(b->stream == CU_STREAM_LEGACY || names_created_stream(b->stream))) continue;
      auto it = std::find_if(recorded.begin(), recorded.end(), [&](const auto& r) { return r.first == b->stream; });
      if (it == recorded.end()) {
        const uint64_t e = record_on(b->stream);
        recorded.emplace_back(b->stream, e == 0 ? nullptr : new ReuseEvent{e, 0});
        it = std::prev(recorded.end());
      }
      if (it->second != nullptr) {
        b->event = it->second;
        ++b->event->refs;
      }
    }
    // Answers are kept by event until every block was asked: clearing frees events, and a new
    // one could take a freed one's address.
    std::vector<std::pair<ReuseEvent*, bool>> answers;
    std::vector<bool> done(blocks.size(), false);
    for (size_t i = 0; i < blocks.size(); ++i) {
      Block* b = blocks[i];
      if (b->stream == nullptr) {
        done[i] = true;
        continue;
      }
      if (b->event == nullptr) continue;  // the mark without an event: a synchronization releases it
      auto it = std::find_if(answers.begin(), answers.end(), [&](const auto& a) { return a.first == b->event; });
      if (it == answers.end()) {
        answers.emplace_back(b->event, backend_.event_done(b->event->handle));
        it = std::prev(answers.end());
      }
      done[i] = it->second;
    }
    size_t kept = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!done[i]) continue;
      clear(blocks[i]);
      blocks[kept++] = blocks[i];
    }
    blocks.resize(kept);
  }
  // `gone` is being merged into `keep` (mergeable): the merged block waits for the later of the
  // two frees, which neither event may stand for, so both are dropped (recorded again on need).
  void absorb(Block* keep, Block* gone) {
    clear(gone);
    drop_event(keep);
  }
  void clear(Block* b) {
    drop_event(b);
    b->stream = nullptr;
  }

  // ---- plain frees ----
  // `b` was freed with cudaFree (or during a capture): it waits for its epoch's fence.
  void hold(Block* b) {
    open_.blocks.push_back(b);
    open_.bytes += b->size;
    waiting_bytes_ += b->size;
    ++waiting_blocks_;
    if (open_.bytes >= epoch_bytes_) seal();
  }
  // Without waiting: closes the open epoch, and hands every block whose fence has completed to
  // `release(std::vector<Block*>&)` (the blocks of one epoch at a time, oldest first). True if
  // anything was released.
  template <typename Release>
  bool collect(Release&& release) {
    if (backend_.capture_active()) return false;
    seal();
    return poll(release);
  }
  // collect() without closing the open epoch: cheap enough for every allocation (nothing at all
  // while no closed epoch waits; else one query, of the oldest fence). A fence that was not done
  // a moment ago is seldom done now, and each query is a driver call: after a "not yet" the next
  // kPollBackoff calls do not ask. Nothing waits for it: a pool that finds no free block asks at
  // once (collect), and a device that has finished (the replay's) is never asked twice.
  template <typename Release>
  bool poll_closed(Release&& release) {
    if (sealed_.empty()) return false;
    if (poll_backoff_ > 0) {
      --poll_backoff_;
      return false;
    }
    if (backend_.capture_active()) return false;
    const bool any = poll(release);
    if (!sealed_.empty()) poll_backoff_ = kPollBackoff;
    return any;
  }
  bool has_closed_epochs() const { return !sealed_.empty(); }
  // Blocks until the oldest epoch's fence completes (closing the open epoch first if it is the
  // only one), then releases what completed. False if nothing could be waited for.
  template <typename Release>
  bool wait_oldest(Release&& release) {
    if (backend_.capture_active()) return false;
    if (sealed_.empty()) seal();
    return wait_oldest_closed(release);
  }
  // Before a pool carves a request out of a larger free block: while no free block fits it
  // exactly (`exact_fit()`) and a closed epoch waits for its fence, wait for the oldest closed
  // epoch and release it. PyTorch, whose frees are stream-ordered, would have those blocks back
  // at once, often one of this very size; carving around them while the device catches up made
  // both pools fragment and grow on a device running behind the host (the CPU corpus replayed
  // with plain frees under --gpu-time model: caching 1.03-1.14x PyTorch's peak reserved, 0.99-1.00x
  // with this; vmm utilization 0.90-0.95 -> 0.94-0.98), for more fence waits. A program that calls
  // cudaFree pays more without a pool: every cudaFree synchronizes the whole device.
  template <typename ExactFit, typename Release>
  void wait_before_carving(ExactFit&& exact_fit, Release&& release) {
    while (has_closed_epochs() && !exact_fit() && wait_oldest_closed(release)) {
    }
  }
  // Blocks until the oldest closed epoch's fence completes, then releases what completed; never
  // closes the open epoch (its frees are the most recent: their work is the furthest from done).
  // False if no closed epoch waits, nothing could be waited for, or nothing was released.
  template <typename Release>
  bool wait_oldest_closed(Release&& release) {
    if (sealed_.empty() || backend_.capture_active() || sealed_.front().fence == 0) return false;
    if (!backend_.wait_fence(sealed_.front().fence)) return false;
    ++waits_;
    return poll(release);
  }
  template <typename Release>
  bool poll(Release&& release) {
    bool any = false;
    while (!sealed_.empty()) {
      Epoch& e = sealed_.front();
      if (e.fence == 0 || !backend_.fence_done(e.fence)) break;
      backend_.release_fence(e.fence);
      Epoch done = std::move(e);
      sealed_.pop_front();
      waiting_bytes_ -= done.bytes;
      waiting_blocks_ -= done.blocks.size();
      release(done.blocks);
      any = true;
      recycle(std::move(done.blocks));
    }
    return any;
  }
  // Synchronizes the device (counted) and hands every waiting block to `release`; the caller
  // then knows that every stream-ordered free so far is idle too, save those that
  // synchronized_idle() says are not. False during capture or if the driver refused.
  template <typename Release>
  bool synchronize(Release&& release) {
    if (backend_.capture_active()) return false;
    if (backend_.synchronize() != CUDA_SUCCESS) return false;
    ++syncs_;
    settled_after_sync(release);
    return true;
  }
  // The device was synchronized by someone else: everything waiting is idle.
  template <typename Release>
  void settled_after_sync(Release&& release) {
    std::vector<Block*> all = spare_storage();
    for (Epoch& e : sealed_) {
      if (e.fence != 0) backend_.release_fence(e.fence);
      all.insert(all.end(), e.blocks.begin(), e.blocks.end());
      recycle(std::move(e.blocks));
    }
    sealed_.clear();
    all.insert(all.end(), open_.blocks.begin(), open_.blocks.end());
    open_.blocks.clear();
    open_.bytes = 0;
    waiting_bytes_ = 0;
    waiting_blocks_ = 0;
    release(all);
    recycle(std::move(all));
  }
  // After synchronize(): is the free `b` idle? Not if it was freed in the order of another
  // context's stream (its event recorded there, or a created stream of that context named and no
  // event yet): that context's work may still use it, and it waits for its stream as before.
  bool synchronized_idle(const Block* b) {
    if (b->event != nullptr) return backend_.synchronize_covers(b->event->handle);
    return !names_created_stream(b->stream) || !foreign(b->stream, nullptr);
  }
  template <typename Fn>
  void for_each_waiting(Fn&& fn) const {
    for (const Epoch& e : sealed_)
      for (Block* b : e.blocks) fn(b);
    for (Block* b : open_.blocks) fn(b);
  }

  uint64_t waiting_bytes() const { return waiting_bytes_; }
  uint64_t waiting_blocks() const { return waiting_blocks_; }
  size_t waiting_capacity() const {  // host memory of the epochs' lists, for the report
    size_t n = open_.blocks.capacity();
    for (const Epoch& e : sealed_) n += e.blocks.capacity();
    return n;
  }
  uint64_t syncs() const { return syncs_; }
  uint64_t waits() const { return waits_; }
  uint64_t fences() const { return fences_; }

 private:
  struct Epoch {
    std::vector<Block*> blocks;
    uint64_t bytes = 0;
    uint64_t fence = 0;  // 0: none could be recorded; only a synchronization releases it
  };

  void seal() {
    if (open_.blocks.empty() || backend_.capture_active()) return;
    open_.fence = backend_.record_device_fence();
    ++fences_;
    sealed_.push_back(std::move(open_));
    open_ = Epoch{};
    open_.blocks = spare_storage();
  }
  // Backend::foreign_stream, asked only once the program has made a context of its own.
  bool foreign(CUstream stream, uint64_t* event) {
    return foreign_possible_.load(std::memory_order_acquire) && backend_.foreign_stream(stream, event);
  }
  // An event recorded now on `stream`, which a block names (the legacy stream: the pool context's;
  // a created stream: any context's, the event then made in that context, as freed_on_stream's).
  uint64_t record_on(CUstream stream) {
    uint64_t e = 0;
    if (names_created_stream(stream) && foreign(stream, &e)) return e;
    return backend_.record_event(stream);
  }
  void drop_event(Block* b) {
    if (b->event && --b->event->refs == 0) {
      backend_.release_event(b->event->handle);
      delete b->event;
    }
    b->event = nullptr;
  }
  // Epoch lists are reused: a steady loop fills the same number of them over and over.
  std::vector<Block*> spare_storage() {
    if (spare_.empty()) return {};
    std::vector<Block*> v = std::move(spare_.back());
    spare_.pop_back();
    return v;
  }
  void recycle(std::vector<Block*>&& v) {
    v.clear();
    if (spare_.size() < 4 && v.capacity() > 0) spare_.push_back(std::move(v));
  }

  Backend& backend_;
  const std::atomic<bool>& foreign_possible_;
  const uint64_t epoch_bytes_;
  Epoch open_;
  std::deque<Epoch> sealed_;
  std::vector<std::vector<Block*>> spare_;
  uint64_t waiting_bytes_ = 0, waiting_blocks_ = 0, syncs_ = 0, fences_ = 0, waits_ = 0;
  uint32_t poll_backoff_ = 0;  // poll_closed calls left that do not query (after a "not yet")
  static constexpr uint32_t kPollBackoff = 8;
};

}  // namespace gpushim
