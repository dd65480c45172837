// Per-thread cache of captured stacks: a call site that allocates again costs a validation of the
// words its last unwind read, not an unwind (issue 30).
//
// What makes a hit sound. An unwind is a pure function of where it starts (the capturing
// function's frame address, which the key holds), of the unwind rules of the code at each return
// address, and of the stack words it reads. On a miss the stack is unwound as before and, for a
// stack seen twice in a row, walked once more frame by frame (trace_native_frames) to learn which
// words the unwinder read: each frame's return-address slot, and the slot its frame pointer was
// restored from wherever the next frame's address is computed from that frame pointer
// (conservatively: wherever the frame pointer points into its own frame). A hit re-reads those
// words and requires every one unchanged; by induction from the innermost frame each frame then
// has the same return address, stack pointer and frame pointer, so the unwinder would read the
// same words again and return the same stack. This is the model of libunwind's own fast trace
// (x86_64/Gtrace.c): the CFA is rsp or rbp plus a constant, the return address sits at CFA - 8,
// rbp is unchanged or saved in the stack, and a caller's rsp is its callee's CFA. Two callers
// sharing the innermost frames differ in a return-address slot further out; a recursion one level
// deeper moves every frame. Stacks outside the model are never cached: signal frames, unwinds that
// stopped on an error; a realigned frame (GCC's DRAP: the CFA read from the word its prologue
// saved under rbp) has that word checked too. A change of the loaded objects (dlopen, dlclose:
// the loader's counters, read with dl_iterate_phdr, which takes the loader's list lock for a few
// loads) empties the cache, since the unwind rules at an address belong to the object mapped
// there (libunwind's per-thread rule cache is keyed by address alone and never emptied).
//
// Python frames are part of the key and checked frame by frame: the frame record, the code object,
// the instruction offset (so a new line is a new stack) and the code object's identity (a code
// object freed and another allocated at its address is told apart as PythonCodeTable does).
//
// Memory: at most kSets * kWays entries and kMaxBytes of checks per thread, plus ~60 KiB of
// fixed tables (total_bytes()); freed when the thread exits. Only the owning thread touches its cache (no lock, no atomics); a capture that
// re-enters it (a signal handler) bypasses it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "python/python_code_table.h"
#include "python/python_frame_walker.h"
#include "python/python_layout.h"
#include "stacks/native_stack.h"
#include "stacks/stack_table.h"

namespace gpushim {

struct StackWordCheck {
  uint64_t addr;   // a word of the thread's stack
  uint64_t value;  // what the unwinder read there
};

class ThreadStackCache {
 public:
  // Frames a cached stack may span (StackCapturer's deepest unwind and its slack).
  static constexpr size_t kMaxNativeTraceFrames = 272;
  static constexpr size_t kSets = 64;
  static constexpr size_t kWays = 8;
  // Bytes of checks one thread's cache may hold (an entry of a deep stack with Python frames takes
  // a few KiB; a typical one under 2 KiB).
  static constexpr size_t kMaxBytes = 1u << 20;

  // What a capture knows before unwinding: who captures (StackCapturer::cache_owner_), where
  // (its frame address) and the Python frames (walked first: they are cheap).
  struct Probe {
    uint64_t owner;
    uintptr_t frame_address;
    const PyFrameRef* python;
    size_t n_python;
    const PythonLayout* layout;  // null when n_python is 0
  };

  // The calling thread's cache, or null while it is in use further down this thread's stack (a
  // signal handler) or after the thread began to exit. Give it back with release().
  static ThreadStackCache* acquire();
  void release() { busy_ = false; }

  // The stack id cached for this probe if every checked word still holds its value.
  bool find(const Probe& p, StackId* id);

  // Called on a miss with the id just captured. True when the same stack was captured by one of
  // the last misses with this key's set too: then the caller traces it and calls insert(), so that
  // one-off stacks never pay for a trace.
  bool seen_twice(const Probe& p, StackId id);

  // Builds the checks from a trace taken in the capturing function (whose frame address is
  // p.frame_address) right after capture_native_stack returned `native[0..got)` from a request for
  // `want` frames, and caches `id`. Returns false (and caches nothing) when the stack is not one
  // the checks cover.
  bool insert(const Probe& p, const NativeFrameTrace* trace, size_t n_trace, const uint64_t* native, size_t got,
              size_t want, StackId id);

  size_t entries() const;
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t traces() const { return traces_; }

  // Room for one trace_native_frames of kMaxNativeTraceFrames (kept here, not on the hook's stack).
  NativeFrameTrace* trace_buffer() { return trace_; }

  // The loader's load and unload counters (dl_iterate_phdr), one number: changes when objects
  // are loaded or unloaded.
  static uint64_t loaded_objects_generation();

  // Host bytes held by every thread's cache, for the shim's self-accounted memory.
  static size_t total_bytes();

  ~ThreadStackCache();

 private:
  struct PyCheck {
    uintptr_t frame, code;
    int32_t offset;
    bool ends_eval_call;
    PythonCodeIdentity identity;
  };
  struct Entry {
    uint64_t key = 0;
    uint64_t owner = 0;
    uintptr_t frame_address = 0;
    uint32_t n_checks = 0, n_python = 0;
    StackWordCheck* checks = nullptr;  // one block: n_checks words, then n_python PyChecks
    StackId id = kEmptyStack;
    uint32_t last_use = 0;
    uint32_t bytes = 0;
  };
  struct Set {
    Entry ways[kWays];
    // The last misses of this set, as (key, id): a stack met again among them is cached.
    uint64_t pending_key[kWays] = {};
    StackId pending_id[kWays] = {};
    uint32_t pending_next = 0;
    // Stacks the checks do not cover (insert refused them): never traced again.
    uint64_t refused_key[4] = {};
    StackId refused_id[4] = {};
    uint32_t refused_next = 0;
  };

  static uint64_t key_of(const Probe& p);
  bool matches(const Entry& e, const Probe& p, uint64_t key) const;
  bool build(const Probe& p, const NativeFrameTrace* trace, size_t n_trace, const uint64_t* native, size_t got,
             size_t want, StackId id);
  void clear();

  Set sets_[kSets];
  NativeFrameTrace trace_[kMaxNativeTraceFrames];
  StackWordCheck scratch_[2 * kMaxNativeTraceFrames + 2];
  uint64_t generation_ = 0;
  uint32_t clock_ = 0;
  size_t bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0, traces_ = 0;
  bool busy_ = false;
};

}  // namespace gpushim
