// Replays the allocations of a trace through a policy on a simulated device: the pools are built by
// policy/policy_factory.h over policy/sim_backend.h, the very code the shim runs, so "what if this
// job had run with the vmm policy on a 40 GB card" gets the answer the shim would have given.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "gpu_time.h"
#include "policy/sim_backend.h"
#include "trace_reader.h"

namespace gpushim::analysis {

// Policies that exist only in replay, as baselines: PyTorch's CUDA caching allocator with default
// settings, and with expandable_segments:True (analysis/pytorch_policy.h). kShim: config.policy.
enum class ReplayModel { kShim, kPyTorch, kPyTorchExpandable };

struct ReplaySettings {
  Config config;                // policy and its knobs
  ReplayModel model = ReplayModel::kShim;  // else the PyTorch baseline replaces config.policy
  bool limit_given = false;     // else each device keeps the cap it was recorded with
  LimitSpec limit;              // when limit_given; inactive = no cap
  uint64_t capacity = 0;        // simulated device size; 0: the recorded capacity (else 16 TiB)
  // Under the recorded policy, cap, capacity and settings (false when settings were overridden),
  // the pools place every block as the run did: a trace's reuse moments (kReuse) decide when the
  // simulated device completes fences and events, and its segment_alloc and va_reserve events where
  // each segment or address range lies (best fit breaks ties by address). Otherwise the simulated
  // device hands them out at rising addresses of its own and, as for traces without reuse moments,
  // completes fences and events at once.
  bool follow_recorded_reuse = true;
  // When fences and events complete (gpu_time.h). kRecorded is the above; kModel completes them
  // where `lags` (per device; estimate_device_lag) says, under every policy alike.
  GpuTime gpu_time = GpuTime::kRecorded;
  std::shared_ptr<const std::map<int, DeviceLag>> lags;  // kModel; null: estimated by replay_trace
  // Every device allocation and free replayed as stream-ordered (cudaMallocAsync/cudaFreeAsync) on
  // its recorded stream: what PyTorch's backend:cudaMallocAsync (the launcher's --torch-alloc
  // async) makes of a job whose tensors were recorded as plain cudaMalloc/cudaFree.
  bool stream_ordered = false;
};

struct ReplayDevice {
  int device = 0;
  uint64_t capacity = 0, limit = 0;
  uint64_t allocs = 0, frees = 0;
  uint64_t peak_allocated = 0, peak_reserved = 0;
  uint64_t peak_requested = 0;  // highest sum of the bytes the program asked for (no rounding)
  uint64_t end_allocated = 0;
  // The first allocation the simulated device (or the cap) refused.
  uint64_t ooms = 0;
  uint64_t oom_event = 0;  // 1-based index into TraceData::events
  uint64_t oom_t_ns = 0, oom_requested = 0, oom_allocated = 0, oom_reserved = 0;
  uint32_t oom_stack = 0;
  // Allocations the recorded run was refused (its OOM events) are tried again: under another
  // policy or cap they may fit. One that fits is released at once (the program never had it).
  uint64_t recorded_ooms = 0, recorded_ooms_avoided = 0;
  // Where the replay's answer first differs from the run's: an allocation the run got that the
  // replay refused, or a refusal of the run the replay avoided (0: none). What the trace cannot
  // hold, and so may explain a difference under the recorded policy and cap:
  uint64_t first_difference_event = 0;
  uint64_t cross_stream_reuse_frees = 0;  // stream-ordered frees on streams other than the first
  uint64_t graph_bytes_peak = 0;          // graph memory: charged to the cap, not replayed as blocks
  uint64_t oom_device_short = 0;          // recorded OOMs the device itself (not the cap) refused
  // The replay completed fences and events where the run saw them complete (kReuse events); then
  // every allocation must get the size the run got, and `difference` says what first did not.
  bool follows_recorded_reuse = false;
  std::string difference;
  // Under kModel: the device's typical backlog and where it comes from.
  uint64_t backlog_ns = 0;
  std::string backlog_source;
  // What a replay that follows the recorded reuse learned of the device (estimate_device_lag).
  // Only those before the replay first departed from the run (completion_departed_ns; 0: never).
  std::vector<SimBackend::CompletionSample> completion_samples;
  uint64_t completion_departed_ns = 0;
  SimCounters driver;      // calls the pool made to the (simulated) driver
  // Synchronizations from the second iteration mark on (the steady state, after a first step that
  // creates parameters, optimizer state and the first of each shape); -1 when the trace has fewer
  // than two marks.
  int64_t steady_synchronizes = -1;
  // Mappings and unmappings (vmm) in the same steady state: each is a driver call of tens of
  // microseconds or more on a GPU, and CUDA does not say whether an unmap waits for the device.
  int64_t steady_maps = -1, steady_unmaps = -1;
  uint64_t forwarded_calls = 0;  // allocations and frees served by CUDA directly (passthrough, capture)
  uint64_t driver_calls() const { return driver.driver_calls() + forwarded_calls; }
  double utilization() const {
    return peak_reserved ? static_cast<double>(peak_allocated) / static_cast<double>(peak_reserved) : 1.0;
  }
};

struct ReplayResult {
  std::string policy;
  GpuTime gpu_time = GpuTime::kRecorded;
  bool available = true;  // false: this build has no such policy (make_pool gave nothing)
  uint64_t events = 0;    // device-memory events replayed
  double seconds = 0;     // wall time of the replay loop
  std::vector<ReplayDevice> devices;
};

ReplayResult replay_trace(const TraceData& trace, const ReplaySettings& settings);

// The device backlog of each device for --gpu-time model: measured by a replay under the recorded
// policy and configuration (`recorded`) that follows the trace's reuse events, where it has them;
// else a fraction of the trace's median step (iteration marks), else a fixed typical backlog.
std::map<int, DeviceLag> estimate_device_lag(const TraceData& trace, const Config& recorded);

// Peak allocated device memory per device as the trace records it: the sizes the shim handed out,
// summed in the trace's order. A replay under the recorded policy must give exactly this.
std::map<int, uint64_t> recorded_peak_allocated(const TraceData& trace);

// The configuration a trace was recorded with (its GPUSHIM_* assignments), with `overrides`
// ("NAME=value") applied on top. Unknown or invalid recorded entries are skipped with a note.
bool recorded_config(const TraceData& trace, const std::vector<std::string>& overrides, Config* out,
                     std::vector<std::string>* notes, std::string* error);

// Policies this build can replay, in order: passthrough, caching, then vmm when it exists.
std::vector<PolicyKind> available_policies();
bool parse_policy_name(const std::string& name, PolicyKind* out);

// "pytorch" and "pytorch-expandable": the replay-only baselines, in the order they are offered.
const std::vector<std::pair<std::string, ReplayModel>>& replay_baselines();

}  // namespace gpushim::analysis
