// Walks the calling thread's Python frames (innermost first), reading interpreter structures
// directly. Needs no GIL, takes no lock, allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "python/python_runtime.h"

namespace gpushim {

struct PyFrameRef {
  uintptr_t code = 0;    // the PyCodeObject, alive while the frame runs
  uintptr_t frame = 0;   // the frame record (PyFrameObject or _PyInterpreterFrame)
  int32_t byte_offset = -1;  // of the current instruction in the code; -1 before the first
  // The outermost Python frame run by one native call of the eval loop. Before 3.11 every frame is
  // one; from 3.11 a Python-to-Python call stays inside the same native eval call.
  bool ends_eval_call = false;
};

// Writes up to `max` frames of the calling thread into `out` and returns how many. 0 when the
// thread runs no Python code, has no thread state, or the interpreter is finalizing (other
// threads' states are being freed then). Stops at the first frame that does not look like one
// (its code object is not a code object) rather than guess.
size_t walk_python_frames(const PythonRuntime& rt, PyFrameRef* out, size_t max);

// Copies up to `max` positional argument references (object addresses) of a frame from
// walk_python_frames; returns how many. Used to tell one activation of a function from the next.
size_t read_python_arguments(const PythonRuntime& rt, const PyFrameRef& f, uintptr_t* out, size_t max);

// How many frames of the thread `tstate` run `code`, counting up to `max`. The caller holds the
// GIL, or `tstate` is its own thread state (the chain only changes in its own thread). Every
// frame of the chain is compared, including those that walk_python_frames leaves out.
size_t python_frames_running(const PythonRuntime& rt, uintptr_t tstate, uintptr_t code, size_t max);

// The outermost frame of the thread `tstate` that runs `code`, 0 if none; same conditions.
uintptr_t python_outermost_frame_running(const PythonRuntime& rt, uintptr_t tstate, uintptr_t code);

}  // namespace gpushim
