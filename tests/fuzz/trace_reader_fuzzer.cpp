// libFuzzer target: gpushim-analyze's trace reader on arbitrary bytes (corrupted, truncated or
// hostile binary traces: a crash, kill -9 or a full disk cuts a real trace anywhere).
//
// Checked on every input (a violation traps, which libFuzzer reports as a crash): parse_trace
// either refuses the input with one clear line (not a trace at all) or reads it up to the damage,
// with what it read consistent (events in time order, no more bytes used than given), and the
// allocated/reserved timeline the analysis draws from it builds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "run_view.h"
#include "trace_reader.h"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  gpushim::analysis::TraceData trace;
  std::string error;
  if (!gpushim::analysis::parse_trace(bytes, &trace, &error)) {
    require(!error.empty() && error.size() < 1000 && error.find('\n') == std::string::npos);
    return 0;
  }
  require(gpushim::analysis::looks_like_trace(bytes));
  require(trace.bytes_used <= size);
  for (size_t i = 1; i < trace.events.size(); ++i) require(trace.events[i - 1].t_ns <= trace.events[i].t_ns);
  const auto timeline = gpushim::analysis::trace_timeline(trace, 64);
  (void)timeline;
  return 0;
}
