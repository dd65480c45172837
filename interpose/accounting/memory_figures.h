// The five figures every view of one kind of memory shows, declared once: live bytes, live count,
// peak, allocations and frees. The books' snapshots (CounterSnapshot, ModuleSnapshot), the
// report's rows (DeviceReport, ModuleReport, OtherMemoryReport), the trace's end chunk (trace::DeviceTotals)
// and the metrics file's devices (DeviceMetrics) are built on it, so a figure means one thing
// and moves from one view to the next in one assignment (set_figures), never field by field.
// What each view writes (JSON keys, trace varints, metric names) stays that view's own.
#pragma once

#include <cstdint>

namespace gpushim {

struct MemoryFigures {
  uint64_t live_bytes = 0;    // allocated (policy-rounded) bytes still live
  uint64_t live_count = 0;    // allocations still live
  uint64_t peak_bytes = 0;    // the most live bytes at any moment of the run
  uint64_t total_allocs = 0;  // successful allocations over the run
  uint64_t total_frees = 0;

  const MemoryFigures& figures() const { return *this; }
  // Takes the five figures of `from` (any struct built on them), leaving the rest of this alone.
  void set_figures(const MemoryFigures& from) { *this = from; }
};

}  // namespace gpushim
