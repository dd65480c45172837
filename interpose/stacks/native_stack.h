// Native stack capture for the allocation hot path.
//
// Uses libunwind's unw_backtrace, loaded with dlopen(RTLD_LOCAL) on first use: linking libunwind
// would rebind the host process's C++ exceptions to libunwind's _Unwind_* (design-notes §2).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpushim {

// Loads the unwinder. Idempotent and thread-safe; returns false (and logs one line) if no usable
// unwinder exists, in which case capture_native_stack always returns 0.
bool init_native_unwinder();

// Captures up to `max_depth` return addresses of the calling thread into `out`, innermost first,
// skipping the innermost `skip` frames (the shim's own). Returns the number written. Never
// allocates after init_native_unwinder() succeeded.
size_t capture_native_stack(uint64_t* out, size_t max_depth, size_t skip);

// One frame of trace_native_frames: where the unwinder found what it read. The stack cache
// (stack_cache.h) re-reads exactly these words to tell that a stack is still the one it unwound.
struct NativeFrameTrace {
  uint64_t ip = 0;        // the frame's instruction pointer (a return address past frame 0)
  uint64_t sp = 0;        // its stack pointer: the callee's canonical frame address
  uint64_t rbp = 0;       // its frame pointer register as the unwinder restored it
  uint64_t ip_slot = 0;   // the stack word ip was read from; 0 if not from memory
  uint64_t rbp_slot = 0;  // the stack word rbp was restored from; 0 if not from memory
  bool signal_frame = false;
  bool step_failed = false;  // the unwinder stopped past this frame with an error
};

// Whether trace_native_frames works (libunwind with its cursor API, x86-64).
bool native_trace_available();

// Walks the calling thread's stack frame by frame with libunwind's cursor (microseconds: for the
// stack cache's misses only), out[0] being the caller of this function. Returns the frames written.
size_t trace_native_frames(NativeFrameTrace* out, size_t max);

}  // namespace gpushim
