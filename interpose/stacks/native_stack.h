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

}  // namespace gpushim
