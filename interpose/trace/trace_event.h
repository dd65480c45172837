// One trace event as the allocating thread hands it over: a fixed-size record, copied into a
// per-thread ring and encoded later by the writer thread (trace_encoder.h).
#pragma once

#include <cstdint>

#include "trace/trace_format.h"

namespace gpushim::trace {

struct TraceEvent {
  uint64_t t_ns = 0;       // monotonic clock (util/clock.h)
  uint64_t addr = 0;       // block or segment address
  uint64_t size = 0;       // policy size; segment size; oom: device free; iteration: number; dropped: count
  uint64_t requested = 0;  // bytes the caller asked for (alloc, oom)
  uint64_t stream = 0;     // CUstream handle value
  // Pool events only (kFlagSequenced): the operation's number in its device's pool order, which
  // readers follow over timestamps for those events (recorder/trace_ordered_resource.h).
  uint64_t seq = 0;
  uint32_t stack = 0;      // StackId (alloc, oom)
  int16_t device = 0;
  EventKind kind = EventKind::kAlloc;
  uint8_t flags = 0;       // kFlag* in trace_format.h
};
static_assert(sizeof(TraceEvent) == 56, "one ring slot; keep it small");

}  // namespace gpushim::trace
