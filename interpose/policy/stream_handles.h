// What the stream handles the pools keep on blocks mean, and which of them may be named to the
// driver (cuda/stream_registry.h says how a created stream's name stays valid).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gpushim {

// The legacy default stream has two spellings.
inline CUstream normalize_stream(CUstream s) { return s == nullptr ? CU_STREAM_LEGACY : s; }
// Put on a block whose reuse is ordered by its event alone, because the stream it was freed on can
// no longer be named: destroyed, or the per-thread default stream, whose handle names another
// stream in every thread. Never passed to the driver.
inline CUstream event_ordered_mark() { return reinterpret_cast<CUstream>(uintptr_t{0x3}); }
// Two uses of the per-thread default stream handle, or of the mark, are never "the same stream".
inline bool same_stream(CUstream a, CUstream b) {
  return a == b && a != CU_STREAM_PER_THREAD && a != event_ordered_mark();
}
// A handle the program created: not null, the legacy or per-thread default stream, or the mark.
inline bool names_created_stream(CUstream s) { return reinterpret_cast<uintptr_t>(s) > 0x3; }

}  // namespace gpushim
