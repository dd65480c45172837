// The formats gpushim-analyze export writes, for viewers people already use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "run_view.h"
#include "trace_reader.h"

namespace gpushim::analysis {

class OfflineSymbolizer;

// PyTorch memory snapshot (pytorch.org/memory_viz): a pickle with "segments" (the state at the
// end: blocks tile each segment exactly) and "device_traces" (every event, oldest first, which
// the viewer replays backwards from the segments). At most `max_events` newest events per device
// are kept (0: all). Repairs made for an incomplete trace are described in `notes`.
std::string memory_viz_from_trace(const TraceData& trace, OfflineSymbolizer& sym, size_t max_events,
                                  std::vector<std::string>* notes);
// A report knows only what is live, by site, without addresses: each live site becomes one block
// (all its live bytes) in a segment of its own at a made-up address, and there is no history.
std::string memory_viz_from_run(const RunView& run);

// Folded stacks ("outer;...;inner bytes" per line) for flamegraph.pl, speedscope and inferno.
// `at_peak`: weigh each site by what it held when its device peaked (traces); else by live bytes.
// A frame is its function (Python: function and file), so that a function that allocates from
// several lines is one box, as profilers show it; `lines` adds the line, one box per line.
std::string folded_from_run(const RunView& run, bool at_peak, bool lines = false);
// The same sites in speedscope's JSON file format: unit "bytes", frames with their file (and line
// with `lines`), one profile per device (and per other memory kind).
std::string speedscope_from_run(const RunView& run, bool at_peak, bool lines = false);

// Chrome Trace Event JSON for Perfetto: counter tracks of allocated and reserved per device (and
// the cap), instant events for OOMs and iteration marks.
std::string perfetto_from_trace(const TraceData& trace, size_t max_points_per_device);
std::string perfetto_from_run(const RunView& run);

// Perfetto's own protobuf trace (export_perfetto_proto.cpp): a native heap profile per device
// (callstacks with bytes and counts allocated and freed, dumped at the peak and at the end) for the
// UI's flame graph, and counter tracks in bytes.
std::string perfetto_proto_from_trace(const TraceData& trace, size_t max_points_per_device);
std::string perfetto_proto_from_run(const RunView& run);

// Allocated/reserved over time as JSON, for scripts/gpushim-plot.
std::string timeline_json(const RunView& run, const std::vector<TimelineSample>& timeline);

}  // namespace gpushim::analysis
