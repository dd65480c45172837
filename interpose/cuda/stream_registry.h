// The streams the shim names to the driver on its own, and the rule that keeps every such name
// valid. On a real GPU a destroyed stream is not an error code: NVIDIA's driver dereferences the
// freed handle and the host process crashes (design-notes §9). So:
//
//   - A stream the shim may record on is in this registry from its creation (or its first use by
//     an allocation or free, for streams made where no hook saw them) until its destruction, and
//     every driver call naming it is made under the registry's lock. A destroy first takes the
//     stream out under that lock (recording its tail, see below), and only then is forwarded: no
//     call can name it afterwards.
//   - Blocks a pool keeps tagged with a stream (stream-ordered frees) are retagged before the
//     destroy is forwarded (DeviceMemoryResource::forget_streams: their event is recorded while the
//     stream exists, and they carry event_ordered_mark() from then on).
//   - A context's destruction or reset destroys its streams without any cuStreamDestroy: the core
//     calls forget_context() for it, which drops them with no driver call (their tail events died
//     with the context, so they are neither queried nor destroyed again).
//
// Also here: the captures in progress (cuda/capture_state.h's count), since a capture ends with its
// stream or its context as well as with cuStreamEndCapture.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "policy/stream_handles.h"
#include "util/thread_block.h"

namespace gpushim {

namespace stream_registry_internal {
// Bumped whenever a stream leaves the registry, so that a thread's memory of "already known" can
// never vouch for a new stream that reuses a destroyed one's handle.
inline std::atomic<uint64_t> g_generation{1};
// The last stream the calling thread told the registry of: a slot of the front's static TLS block,
// a fixed offset from the thread pointer (as a default-model thread_local, __tls_get_addr cost 114
// of the 2,165 instructions of a stream-ordered pair, callgrind).
struct KnownStream {
  CUstream stream;
  uint64_t generation;
  CUcontext context;  // the stream's, as the registry has it (context_of_stream's fast path)
  int device;         // and its device (device_of_stream's)
};
inline KnownStream& known_stream() { return thread_slot<KnownStream, ThreadSlot::kKnownStream>(); }
}  // namespace stream_registry_internal

// ---- hooks ----
// A stream was created (cuStreamCreate*, cuGreenCtxStreamCreate) in the calling thread's current
// context; `context` overrides it when the creating call names one.
void note_stream_created(CUstream stream, unsigned flags, CUcontext context = nullptr);
// An allocation or free names `stream`: registered on first sight (flags and context asked of the
// driver once; the program vouches that the stream exists by using it). Cheap when known: a
// thread-local check of the last stream seen.
void learn_unknown_stream(CUstream stream);  // learn_stream's registration (out of line)
inline void learn_stream(CUstream stream) {
  using namespace stream_registry_internal;
  if (!names_created_stream(stream)) return;
  const KnownStream& known = known_stream();
  if (known.stream == stream && known.generation == g_generation.load(std::memory_order_acquire)) return;
  learn_unknown_stream(stream);
}

// The fork child's registry starts empty (the parent's lock may be held by a thread that does not
// exist there). Called by the core's fork handler (core/shim.cpp), one registration for both.
void stream_registry_after_fork_in_child();
// Before a destroy is forwarded: no call will name `stream` again. A non-blocking stream leaves an
// event at its tail, which device fences wait for until it completes.
void note_stream_destroying(CUstream stream);
// The context is about to be destroyed or reset (`context_alive`: its tail events are destroyed
// now) or was (they died with it): its streams, tails and captures are dropped.
void forget_context(CUcontext context, bool context_alive);
// The context `stream` belongs to, as the registry knows it (null: unknown). Cheap for the stream
// this thread last told learn_stream of.
CUcontext context_of_stream(CUstream stream);
// The device whose work `stream` orders: a default stream (0, legacy, per-thread) is the calling
// thread's current context's, a created one the device it was made on. -1: unknown.
int device_of_stream(CUstream stream);

// ---- captures ----
// A capture began on `stream` (with `per_thread`: the calling thread's per-thread default stream).
void note_capture_began(CUstream stream, bool per_thread);
// The capture on `stream` ended (ended or invalidated: either way it is over).
void note_capture_ended(CUstream stream, bool per_thread);

// ---- device fences (DriverBackend) ----
// The last work of a destroyed non-blocking stream: cuStreamDestroy returns at once, and work
// already queued there still runs. Queried only through the registry, so that a context's end can
// retire it first.
struct StreamTail;
using TailRef = std::shared_ptr<StreamTail>;
// Under the registry's lock: calls `record(stream)` for every live non-blocking stream of `device`
// in `pool_context` (or of unknown context) (so none can be destroyed meanwhile) and collects the
// unfinished tails of destroyed ones. A non-blocking stream of another context on the device (one
// the program made, cuCtxCreate) gets an event made in its own context instead, held as a tail
// that this fence alone owns (the registry drops it with its context). False (nothing kept) when
// a tail's work cannot be proven finished or an event failed: only a synchronization proves it.
bool record_fence_targets(int device, CUcontext pool_context, absl::FunctionRef<bool(CUstream)> record,
                          std::vector<TailRef>* tails);
// The fence holding `tails` is released: events only it owns are destroyed.
void release_fence_tails(std::vector<TailRef>* tails);
// Has the tail's work finished? A tail of a context that is gone counts as finished.
bool tail_done(const TailRef& tail);
// Blocks until it has; false if that cannot be done.
bool wait_tail(const TailRef& tail);
// A device synchronization finished every tail of `device`.
void tails_settled(int device);

// ---- contexts the program makes ----
// The program makes a context other than a device's primary one (cuCtxCreate*,
// cuCtxFromGreenCtx, a green context's stream): from then on a stream may belong to another
// context than its device's pool, which DriverBackend::foreign_stream then asks on every
// stream-ordered call. Until then it need not (the runtime itself uses primary contexts only).
void note_program_context();
bool program_contexts_made();
const std::atomic<bool>* program_contexts_flag();  // what program_contexts_made() reads

// ---- pools' events on streams of program-made contexts (DriverBackend) ----
// An event recorded now on `stream` (a created stream the registry knows, or a default stream of
// the calling thread's current context) in `context`, which is not the pool's: queried with
// tail_done, it counts as finished once that context is gone (the registry drops it with the
// context, which destroys its events). Null if none could be recorded, or `stream` is capturing.
TailRef record_mark(CUstream stream, CUcontext context);
// Its holder is done with it: its event is destroyed.
void release_mark(const TailRef& mark);
// Was `mark` recorded on `stream` of `context`: its legacy stream, or (CU_STREAM_PER_THREAD) the
// calling thread's per-thread default stream there?
bool mark_on_default_stream_of(const TailRef& mark, CUstream stream, CUcontext context);

}  // namespace gpushim
