#include "cuda/stream_registry.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "cuda/capture_state.h"
#include "cuda/real_driver.h"
#include "util/thread_block.h"

namespace gpushim {

struct StreamTail {
  CUevent event = nullptr;  // null: finished, or its context is gone (under the registry's lock)
  bool unknown = false;     // no event could be recorded: only a synchronization proves it finished
  CUcontext context = nullptr;
  int device = -1;
  // A live stream's event for one fence (record_fence_targets), not a destroyed stream's tail:
  // destroyed once seen complete, or with its fence or its context.
  bool fence_mark = false;
  // A mark's stream as its recorder named it (record_mark; a default stream names the one of
  // `context`). Never named to the driver again.
  CUstream stream = nullptr;
  // For a mark on the per-thread default stream: the recording thread (thread_serial), whose
  // stream of `context` it is.
  uint64_t thread = 0;
};

using stream_registry_internal::g_generation;
using stream_registry_internal::known_stream;
using stream_registry_internal::KnownStream;

namespace {

struct Stream {
  CUcontext context = nullptr;
  int device = -1;
  bool non_blocking = false;
};

struct Registry {
  std::mutex mu;
  absl::flat_hash_map<CUstream, Stream> streams;  // every live stream we know of
  std::vector<TailRef> tails;                     // unfinished tails of destroyed non-blocking streams
  // Events on streams of program-made contexts that fences and pools hold (record_mark).
  std::vector<std::weak_ptr<StreamTail>> marks;
  size_t marks_pruned_at = 64;
  // Captures in progress: a created stream, or (per_thread) the thread whose per-thread default
  // stream captures, keyed by that thread's marker address.
  struct Capture {
    CUstream stream;
    const void* thread;  // non-null for a per-thread default stream's capture
    CUcontext context;
    // Recorded on a non-blocking stream just before its capture began: once the stream captures,
    // an event recorded there becomes a node of the graph instead, so this is its tail if it is
    // destroyed while capturing (work queued before the capture still runs).
    CUevent before = nullptr;
  };
  std::vector<Capture> captures;
};

// Set once for good: a fork child inherits it with its parent's memory, as it should.
std::atomic<bool> g_program_contexts{false};


// Never destroyed: hooks may run during exit. A fork child starts with an empty one: the parent's
// lock may be held by a thread that does not exist there, and the parent's streams are not the
// child's (a child of a CUDA process cannot use CUDA; one forked before CUDA has no streams yet).
std::atomic<Registry*> g_registry{nullptr};

Registry& registry() {
  if (Registry* r = g_registry.load(std::memory_order_acquire)) return *r;
  static Registry* const first = [] {
    auto* r = new Registry;
    g_registry.store(r, std::memory_order_release);
    return r;
  }();
  (void)first;
  return *g_registry.load(std::memory_order_acquire);
}

thread_local char t_thread_marker;
// A number of the calling thread's own, never given to another thread (a marker's address may be:
// a thread that ends leaves its per-thread stream's work running).
uint64_t thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t serial = next.fetch_add(1, std::memory_order_relaxed);
  return serial;
}

CUcontext current_context() {
  CUcontext ctx = nullptr;
  if (real_driver().cuCtxGetCurrent) real_driver().cuCtxGetCurrent(&ctx);
  return ctx;
}

void publish_captures(const Registry& r) {
  active_captures().store(static_cast<int>(r.captures.size()), std::memory_order_release);
}

void destroy_event(CUevent e);

// Under r.mu.
void destroy_tail_event(StreamTail& t) {
  destroy_event(t.event);
  t.event = nullptr;
}

// A fresh event recorded on `stream`, or null. `context`, when known and not the caller's, is the
// stream's: the event is made there (an event and the stream it is recorded on must share a
// context; a stream of another device is legally destroyed while that device is not current).
CUevent record_new_event(CUstream stream, CUcontext context = nullptr) {
  const RealDriver& d = real_driver();
  CUevent e = nullptr;
  if (!d.cuEventCreate || !d.cuEventRecord) return nullptr;
  const bool push = context != nullptr && context != current_context();
  if (push && (!d.cuCtxPushCurrent_v2 || !d.cuCtxPopCurrent_v2 || d.cuCtxPushCurrent_v2(context) != CUDA_SUCCESS))
    return nullptr;
  if (d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    e = nullptr;
  } else if (d.cuEventRecord(e, stream) != CUDA_SUCCESS) {
    if (d.cuEventDestroy_v2) d.cuEventDestroy_v2(e);
    e = nullptr;
  }
  if (push) {
    CUcontext popped = nullptr;
    d.cuCtxPopCurrent_v2(&popped);
  }
  return e;
}

void destroy_event(CUevent e) {
  if (e != nullptr && real_driver().cuEventDestroy_v2) real_driver().cuEventDestroy_v2(e);
}

// Under r.mu: an event recorded now on `stream` in `context` (not the pool's), that its holder
// alone owns and that dies with that context (forget_context), as `marks` says.
TailRef new_mark(Registry& r, CUstream stream, CUcontext context, int device) {
  auto mark = std::make_shared<StreamTail>();
  mark->context = context;
  mark->device = device;
  mark->fence_mark = true;
  mark->stream = stream;
  mark->event = record_new_event(stream, context);
  if (mark->event == nullptr) return nullptr;
  // Pools hold marks too, in processes that may never record a fence (which prunes the list).
  if (r.marks.size() >= r.marks_pruned_at) {
    r.marks.erase(std::remove_if(r.marks.begin(), r.marks.end(), [](const auto& w) { return w.expired(); }),
                  r.marks.end());
    r.marks_pruned_at = std::max<size_t>(64, 2 * r.marks.size());
  }
  r.marks.push_back(mark);
  return mark;
}

}  // namespace

void note_program_context() { g_program_contexts.store(true, std::memory_order_release); }

bool program_contexts_made() { return g_program_contexts.load(std::memory_order_acquire); }

const std::atomic<bool>* program_contexts_flag() { return &g_program_contexts; }

void note_stream_created(CUstream stream, unsigned flags, CUcontext context) {
  if (!names_created_stream(stream)) return;
  int device = -1;
  if (!current_context_device(&device)) return;
  if (context == nullptr) context = current_context();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.streams[stream] = Stream{context, device, (flags & CU_STREAM_NON_BLOCKING) != 0};
}

void stream_registry_after_fork_in_child() {
  if (g_registry.load(std::memory_order_relaxed) == nullptr) return;  // never used
  g_registry.store(new Registry, std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_relaxed);  // nothing this thread knew holds there
  active_captures().store(0, std::memory_order_relaxed);
}

void learn_unknown_stream(CUstream stream) {
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  KnownStream& known = known_stream();
  Registry& r = registry();
  int known_device = -1;
  CUcontext known_context = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.streams.find(stream);
    if (it == r.streams.end()) {
      const RealDriver& d = real_driver();
      unsigned flags = 0;
      CUcontext ctx = nullptr;
      int device = -1;
      if (d.cuStreamGetFlags == nullptr || d.cuStreamGetFlags(stream, &flags) != CUDA_SUCCESS) return;
      if (d.cuStreamGetCtx != nullptr && d.cuStreamGetCtx(stream, &ctx) != CUDA_SUCCESS) ctx = nullptr;
      if (!current_context_device(&device)) return;
      it = r.streams.emplace(stream, Stream{ctx, device, (flags & CU_STREAM_NON_BLOCKING) != 0}).first;
    }
    known_device = it->second.device;
    known_context = it->second.context;
  }
  known = KnownStream{stream, gen, known_context, known_device};
}

void note_stream_destroying(CUstream stream) {
  if (!names_created_stream(stream)) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  // Destroying a capturing stream ends its capture; what it queued before the capture is its tail.
  CUevent before_capture = nullptr;
  bool was_capturing = false;
  for (auto it = r.captures.begin(); it != r.captures.end(); ++it)
    if (it->thread == nullptr && it->stream == stream) {
      before_capture = it->before;
      was_capturing = true;
      r.captures.erase(it);
      publish_captures(r);
      break;
    }
  auto it = r.streams.find(stream);
  if (it == r.streams.end()) {
    destroy_event(before_capture);
    return;
  }
  const Stream s = it->second;
  r.streams.erase(it);
  if (!s.non_blocking) {  // the legacy stream's event in every fence already orders after it
    destroy_event(before_capture);
    return;
  }
  // Recorded in the stream's context, which need not be the caller's (a stream of another device
  // may be destroyed while this one is current; recorded here, the event failed and every later
  // fence of the stream's device with it). No event: only a synchronization proves it.
  auto tail = std::make_shared<StreamTail>();
  tail->context = s.context;
  tail->device = s.device;
  tail->event = was_capturing ? before_capture : record_new_event(stream, s.context);
  tail->unknown = tail->event == nullptr;
  r.tails.push_back(std::move(tail));
}

void forget_context(CUcontext context, bool context_alive) {
  if (context == nullptr) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  absl::erase_if(r.streams, [&](const auto& kv) { return kv.second.context == context; });
  // Fences' events on its streams: finished as far as their fences are concerned.
  r.marks.erase(std::remove_if(r.marks.begin(), r.marks.end(),
                               [&](const std::weak_ptr<StreamTail>& w) {
                                 const TailRef t = w.lock();
                                 if (t == nullptr) return true;
                                 if (t->context != context) return false;
                                 if (context_alive) destroy_tail_event(*t);
                                 t->event = nullptr;
                                 return true;
                               }),
                r.marks.end());
  for (auto it = r.tails.begin(); it != r.tails.end();) {
    StreamTail& t = **it;
    if (t.context != context) {
      ++it;
      continue;
    }
    if (context_alive) destroy_tail_event(t);
    t.event = nullptr;  // fences still holding it see it finished: its work went with the context
    t.unknown = false;
    it = r.tails.erase(it);
  }
  const size_t captures = r.captures.size();
  r.captures.erase(std::remove_if(r.captures.begin(), r.captures.end(),
                                  [&](const auto& c) {
                                    if (c.context != context) return false;
                                    if (context_alive) destroy_event(c.before);
                                    return true;
                                  }),
                   r.captures.end());
  if (r.captures.size() != captures) publish_captures(r);
}

CUcontext context_of_stream(CUstream stream) {
  const KnownStream& known = known_stream();
  if (known.stream == stream && known.generation == g_generation.load(std::memory_order_acquire)) return known.context;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.streams.find(stream);
  return it == r.streams.end() ? nullptr : it->second.context;
}

int device_of_stream(CUstream stream) {
  int device = -1;
  if (!names_created_stream(stream)) return current_context_device(&device) ? device : -1;
  // Allocations and frees tell learn_stream first: the answer is then this thread's.
  const KnownStream& known = known_stream();
  if (known.stream == stream && known.generation == g_generation.load(std::memory_order_acquire)) return known.device;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.streams.find(stream);
  return it == r.streams.end() ? -1 : it->second.device;
}

void note_capture_began(CUstream stream, bool per_thread) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  CUevent before = nullptr;
  // The capture is the stream's context's: it ends with that context (forget_context), and its
  // event is destroyed while that context lives. A stream of a context the program made may be
  // captured while the primary is current; kept under the caller's context, the capture outlived
  // its context, every pool held its memory for good, and a later reset destroyed the dead event.
  CUcontext context = current_context();
  if (!per_thread) {
    auto it = r.streams.find(stream);
    if (it != r.streams.end() && it->second.context != nullptr) context = it->second.context;
    // In the stream's context: recorded in the caller's, the event failed, the tail of a stream
    // destroyed mid-capture was unknown, and every later fence of the device failed with it.
    if (it != r.streams.end() && it->second.non_blocking) before = record_new_event(stream, it->second.context);
  }
  r.captures.push_back({per_thread ? nullptr : stream, per_thread ? &t_thread_marker : nullptr, context, before});
  publish_captures(r);
}

void note_capture_ended(CUstream stream, bool per_thread) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = std::find_if(r.captures.begin(), r.captures.end(), [&](const auto& c) {
    return per_thread ? c.thread == &t_thread_marker : (c.thread == nullptr && c.stream == stream);
  });
  if (it == r.captures.end()) return;
  destroy_event(it->before);
  r.captures.erase(it);
  publish_captures(r);
}

bool record_fence_targets(int device, CUcontext pool_context, absl::FunctionRef<bool(CUstream)> record,
                          std::vector<TailRef>* tails) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const RealDriver& d = real_driver();
  for (auto it = r.tails.begin(); it != r.tails.end();) {
    StreamTail& t = **it;
    if (t.device != device) {
      ++it;
      continue;
    }
    if (t.unknown) return false;
    if (t.event == nullptr || (d.cuEventQuery && d.cuEventQuery(t.event) == CUDA_SUCCESS)) {
      destroy_tail_event(t);
      it = r.tails.erase(it);
      continue;
    }
    tails->push_back(*it);
    ++it;
  }
  r.marks.erase(std::remove_if(r.marks.begin(), r.marks.end(), [](const auto& w) { return w.expired(); }),
                r.marks.end());
  for (const auto& [stream, s] : r.streams) {
    if (s.device != device || !s.non_blocking) continue;
    if (s.context == nullptr || s.context == pool_context || pool_context == nullptr) {
      if (!record(stream)) return false;
      continue;
    }
    // Another context's stream: the pool's event first, as before (a context that shares the
    // primary's, a green context, may take it, and then nothing here outlives it); where that
    // fails, an event made in the stream's own context.
    if (record(stream)) continue;
    TailRef mark = new_mark(r, stream, s.context, device);
    if (mark == nullptr) return false;
    tails->push_back(std::move(mark));
  }
  return true;
}

void release_fence_tails(std::vector<TailRef>* tails) {
  if (tails->empty()) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const TailRef& t : *tails)
    if (t->fence_mark) destroy_tail_event(*t);
  tails->clear();
}

TailRef record_mark(CUstream stream, CUcontext context) {
  if (context == nullptr) return nullptr;
  int device = -1;
  if (!names_created_stream(stream) && !current_context_device(&device)) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (names_created_stream(stream)) {
    // Named under the lock only while the registry knows it (a destroy takes it out first): the
    // program's free vouched for it, but another thread may have destroyed it since.
    auto it = r.streams.find(stream);
    if (it == r.streams.end()) return nullptr;
    // A capturing stream would take the event into its graph (pools ask during other streams'
    // captures: ReuseRules::forget_streams).
    for (const auto& c : r.captures)
      if (c.thread == nullptr && c.stream == stream) return nullptr;
    device = it->second.device;
  }
  TailRef mark = new_mark(r, stream, context, device);
  if (mark != nullptr && stream == CU_STREAM_PER_THREAD) mark->thread = thread_serial();
  return mark;
}

bool mark_on_default_stream_of(const TailRef& mark, CUstream stream, CUcontext context) {
  // All fixed when the mark was made: no lock.
  if (mark == nullptr || context == nullptr || mark->stream != stream || mark->context != context) return false;
  if (stream == CU_STREAM_LEGACY) return true;
  return stream == CU_STREAM_PER_THREAD && mark->thread == thread_serial();
}

void release_mark(const TailRef& mark) {
  if (mark == nullptr) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  destroy_tail_event(*mark);
}

bool tail_done(const TailRef& tail) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (tail->unknown) return false;
  if (tail->event == nullptr) return true;
  const bool done = real_driver().cuEventQuery && real_driver().cuEventQuery(tail->event) == CUDA_SUCCESS;
  if (done && tail->fence_mark) destroy_tail_event(*tail);  // its fence's alone, and asked once
  return done;
}

bool wait_tail(const TailRef& tail) {
  // Asked again and again, never waited for under the lock: the stream's work may need another
  // thread of the program (a host function waiting for it), which may be calling a hook that
  // takes this lock (a stream's creation): blocking here held both forever (a review helper's
  // reproducer, e2e.stream_devices). Between asks a context's end may null the event (finished,
  // as far as fences go); under the lock it cannot be destroyed while asked.
  Registry& r = registry();
  for (unsigned asks = 0;; ++asks) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (tail->unknown || real_driver().cuEventQuery == nullptr) return false;
      if (tail->event == nullptr) return true;
      const CUresult q = real_driver().cuEventQuery(tail->event);
      if (q == CUDA_SUCCESS) {
        if (tail->fence_mark) destroy_tail_event(*tail);
        return true;
      }
      if (q != CUDA_ERROR_NOT_READY) return false;
    }
    if (asks < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void tails_settled(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.tails.begin(); it != r.tails.end();) {
    if ((*it)->device != device) {
      ++it;
      continue;
    }
    destroy_tail_event(**it);
    (*it)->unknown = false;
    it = r.tails.erase(it);
  }
}

}  // namespace gpushim
