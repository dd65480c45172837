// When the simulated device finishes work in a replay (`gpushim-analyze replay --gpu-time`).
//
// On a GPU the host runs ahead of the device: memory freed by the program becomes idle only when
// the device has run the work queued before the free. A pool's fences and stream-ordered events
// say when; the replay's SimBackend answers them from a model of the device's backlog:
//   instant   every fence and event completes at once (an infinitely fast device);
//   recorded  under the recorded policy, cap and settings, each completes where the run saw it
//             complete (the trace's reuse events); otherwise as instant;
//   model     a fence or event recorded at host time r completes at completes_at(r), for every
//             policy alike (the recorded one included): what this file estimates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/sim_backend.h"

namespace gpushim::analysis {

enum class GpuTime { kModel, kRecorded, kInstant };
const char* gpu_time_name(GpuTime t);
bool parse_gpu_time(const std::string& name, GpuTime* out);

// The device's backlog over a run, as a function of the host time work was queued at.
//
// From a trace with reuse events, a calibration replay under the recorded policy follows the run's
// own answers and yields, per fence or event, when it was recorded and an interval that holds its
// completion: after the last query that said "not yet", no later than the first that said
// "complete" (SimBackend::CompletionSample). Two things follow:
//   - the typical backlog: the lag that the most intervals hold (0, then a logarithmic grid from
//     1 us to 1 s; a plateau of ties gives its geometric middle);
//   - the device's progress bounds: the device runs its work in order, so work queued at r is done
//     no later than any later-queued work seen complete, and not before any earlier-queued work
//     seen pending.
// completes_at(r) = r + typical backlog, kept inside those bounds. Without samples (1.0 traces, the
// CPU corpus) the backlog is `fallback_ns`, with no bounds.
class DeviceLag {
 public:
  // A fixed backlog: `source` says where it comes from (printed with the replay).
  static DeviceLag fixed(uint64_t backlog_ns, std::string source);
  // Estimated from a calibration replay's samples; `fallback` when there are none.
  static DeviceLag estimate(const std::vector<SimBackend::CompletionSample>& samples, const DeviceLag& fallback);

  uint64_t completes_at(uint64_t recorded_ns) const;
  uint64_t backlog_ns() const { return backlog_ns_; }
  size_t samples() const { return samples_; }
  const std::string& source() const { return source_; }
  void append_source(const std::string& more) { source_ += more; }

 private:
  uint64_t backlog_ns_ = 0;
  size_t samples_ = 0;
  std::string source_;
  // Sorted by recording time: the latest "not yet" of work queued at or before it (prefix max),
  // and the earliest "complete" of work queued at or after it (suffix min).
  std::vector<std::pair<uint64_t, uint64_t>> not_before_, done_by_;
};

// The backlog used for traces that carry no reuse events: a fraction of the median step (the time
// between iteration marks) when the trace has marks, else kTypicalBacklogNs.
constexpr double kTypicalBacklogStepFraction = 0.05;
constexpr uint64_t kTypicalBacklogNs = 1'000'000;  // the H200 fits: 0.32 and 0.96 ms

}  // namespace gpushim::analysis
