// GPUSHIM_ITERATION_SITE: a function whose calls count as iterations, observed passively in the
// allocation stacks of each thread (no hook on the function itself, no GIL, no code patching).
// A Python function is counted exactly by the interpreter instead (python/python_call_counter.h)
// once the first allocation inside it has named its code object; this observation counts native
// functions, and Python ones until then or where the interpreter cannot count.
//
// What counts as a call (one new activation), per thread, comparing each allocation whose stack
// contains the function with the previous allocation of the same thread:
//   - the previous allocation did not have the function on its stack: new activation;
//   - Python: the function's frame record is another one (it runs at another depth): new; or it
//     is the same record, the allocation is at the same or an earlier instruction of the function
//     than the previous one, and the function's positional arguments are other objects, or ints
//     or floats of other value (a temporary argument often gets the freed one's address): new
//     (the function was called again, with the next batch, step number, ...);
//   - native: the call inside the function is at the same or an earlier return address than the
//     previous one (the function started over).
// Where the function occurs several times on one stack (recursion), the outermost counts.
// Limits, by construction: calls that allocate nothing are not seen; a Python function called
// again with the very same argument objects, whose allocations all happen at one instruction, and
// with no allocation outside it in between, looks like one activation (so does one called with a
// temporary str, tuple or object rebuilt at the freed one's address); a native function with a
// loop that allocates at several call sites counts each pass of the loop. gpushim_mark_iteration()
// is exact when that matters.
#pragma once

#include <cstdint>

namespace gpushim {

struct SiteActivation {
  enum Kind : uint8_t { kNone = 0, kPython, kNative };
  static constexpr int kMaxArgs = 4;
  Kind kind = kNone;
  uintptr_t frame = 0;     // Python: the frame record
  int64_t position = 0;    // Python: byte offset in the function; native: return address within it
  uint8_t nargs = 0;       // Python: positional arguments compared (at most kMaxArgs)
  uintptr_t args[kMaxArgs] = {};
};

// Whether `cur` (this allocation) begins a new activation, after `prev` (the thread's previous
// allocation). Pure: the rule above.
bool starts_new_activation(const SiteActivation& prev, const SiteActivation& cur);

}  // namespace gpushim
