// gpushim-analyze replay: the trace's allocations through each policy on a simulated device.
#include <cinttypes>
#include <cstdlib>

#include "cli.h"
#include "json.h"
#include "offline_symbolizer.h"
#include "replay.h"
#include "run_view.h"

namespace gpushim::analysis {
namespace {

std::string fmt_rate(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

std::string first_site(OfflineSymbolizer& sym, uint32_t stack) { return describe_site(sym.stack(stack), "unknown site"); }

int run_replay(const Cli& cli) {
  std::string err;
  const std::string path = cli.operands[0];
  std::string bytes, torn;
  TraceData trace;
  if (!read_file(path, &bytes, &err, &torn)) {
    std::fprintf(stderr, "gpushim-analyze replay: %s\n", err.c_str());  // names the file already
    return 1;
  }
  // A report given to replay was "not a gpushim trace (no GPUSHIMT magic)", which said nothing of
  // what replay needs.
  const size_t opening = bytes.find_first_not_of(" \t\r\n\xEF\xBB\xBF");
  if (!looks_like_trace(bytes) && opening != std::string::npos && bytes[opening] == '{') {
    std::fprintf(stderr,
                 "gpushim-analyze replay: %s is a report: replay needs a trace of the run's every allocation "
                 "(GPUSHIM_TRACE)\n",
                 path.c_str());
    return 1;
  }
  if (!parse_trace_to_read(bytes, &trace, &err)) {
    std::fprintf(stderr, "gpushim-analyze replay: %s: %s\n", path.c_str(), err.c_str());
    return 1;
  }
  bytes.clear();

  std::vector<std::string> notes;
  if (!torn.empty()) notes.push_back(torn);
  ReplaySettings base;
  if (!recorded_config(trace, cli.all("--set"), &base.config, &notes, &err)) return usage_error("replay", err);
  if (cli.has("--limit")) {
    const std::string l = cli.text("--limit");
    base.limit_given = true;
    if (l != "none") {
      const ConfigResult r = parse_config(std::vector<std::pair<std::string, std::string>>{{"GPUSHIM_LIMIT", l}});
      if (!r.ok()) return usage_error("replay", "--limit: " + r.errors.front().message());
      base.limit = r.config.limit;
    }
  }
  base.capacity = cli.bytes("--capacity");
  // Overridden settings make other fences than the run's: its reuse moments would name the wrong ones.
  base.follow_recorded_reuse = cli.all("--set").empty();
  base.stream_ordered = cli.has("--stream-ordered");
  base.gpu_time = GpuTime::kModel;
  parse_gpu_time(cli.text("--gpu-time"), &base.gpu_time);
  if (base.gpu_time == GpuTime::kInstant) base.follow_recorded_reuse = false;
  if (base.gpu_time == GpuTime::kModel) {
    // Measured once per trace, under the recorded policy and settings: the same device for all.
    Config as_recorded;
    std::vector<std::string> ignored;
    if (!recorded_config(trace, {}, &as_recorded, &ignored, &err)) as_recorded = base.config;
    base.lags = std::make_shared<const std::map<int, DeviceLag>>(estimate_device_lag(trace, as_recorded));
  }

  std::vector<std::pair<PolicyKind, ReplayModel>> policies;
  auto baseline = [](const std::string& name, ReplayModel* out) {
    for (const auto& [n, m] : replay_baselines())
      if (n == name) return *out = m, true;
    return false;
  };
  for (const std::string& p : cli.all("--policy")) {
    PolicyKind k = PolicyKind::kCaching;
    ReplayModel m = ReplayModel::kShim;
    if (!baseline(p, &m) && !parse_policy_name(p, &k)) return usage_error("replay", "unknown policy '" + p + "'");
    policies.emplace_back(k, m);
  }
  if (policies.empty()) {
    for (PolicyKind k : available_policies()) policies.emplace_back(k, ReplayModel::kShim);
    for (const auto& [n, m] : replay_baselines()) policies.emplace_back(PolicyKind::kCaching, m);
  }

  PolicyKind recorded = PolicyKind::kCaching;
  const bool recorded_known = parse_policy_name(trace.header.policy, &recorded);
  if (trace.truncated) notes.push_back(trace.stop_note() + "; replaying what it holds");
  if (trace.dropped) notes.push_back(std::to_string(trace.dropped) + " events were dropped while recording: the replay is approximate");
  if (trace.unmatched_frees) notes.push_back(std::to_string(trace.unmatched_frees) + " frees without a recorded allocation were skipped");

  OfflineSymbolizer sym(trace);
  std::vector<ReplayResult> results;
  for (const auto& [kind, model] : policies) {
    ReplaySettings s = base;
    s.config.policy = kind;
    s.model = model;
    results.push_back(replay_trace(trace, s));
  }

  // Does the replay under the recorded policy give the recorded peak allocated? The trace's own
  // figure is the reference; the shim's counters (end record) agree with it whenever allocation
  // is not concurrent, and are shown alongside.
  const std::map<int, uint64_t> trace_peaks = recorded_peak_allocated(trace);
  auto recorded_peak = [&](int device, uint64_t* out) {
    auto it = trace_peaks.find(device);
    if (it == trace_peaks.end()) return false;
    *out = it->second;
    return true;
  };
  auto shim_peak = [&](int device, uint64_t* out) {
    if (!trace.end) return false;
    for (const trace::DeviceTotals& d : trace.end->devices)
      if (d.ordinal == device) return *out = d.peak_bytes, true;
    return false;
  };
  auto shim_peak_reserved = [&](int device, uint64_t* out) {
    if (!trace.end) return false;
    for (const trace::DeviceTotals& d : trace.end->devices)
      if (d.ordinal == device) return *out = d.peak_reserved, true;
    return false;
  };
  const bool config_changed = !cli.all("--set").empty();
  // Under the recorded policy and settings the replay must give the run's answers: the same
  // refusals at the same events. Where it does not, say what the trace could not hold.
  const bool as_recorded = !config_changed && !base.limit_given && base.capacity == 0;
  for (const ReplayResult& r : results) {
    if (!recorded_known || r.policy != std::string(policy_name(recorded)) || !as_recorded) continue;
    for (const ReplayDevice& d : r.devices) {
      if (d.first_difference_event == 0 && d.difference.empty()) continue;
      if (d.first_difference_event == 0) {
        notes.push_back("device " + std::to_string(d.device) + ": under the recorded policy and cap " + d.difference);
        continue;
      }
      const TraceEvent& e = trace.events[d.first_difference_event - 1];
      char head[256];
      std::snprintf(head, sizeof(head),
                    "device %d: under the recorded policy and cap the replay departs from the run at event %" PRIu64
                    " (%.3f s): the run was refused %" PRIu64 " allocation%s, the replay %" PRIu64,
                    d.device, d.first_difference_event, trace.seconds(e.t_ns), d.recorded_ooms,
                    d.recorded_ooms == 1 ? "" : "s", d.ooms);
      std::string why;
      if (!d.difference.empty()) why += "; " + d.difference;
      if (d.cross_stream_reuse_frees && !d.follows_recorded_reuse)
        why += "; " + std::to_string(d.cross_stream_reuse_frees) +
               " stream-ordered frees on other streams: when their memory became reusable elsewhere depended on when "
               "the GPU finished its work, which the trace does not record (the replay waits for the next synchronization)";
      if (d.oom_device_short)
        why += "; " + std::to_string(d.oom_device_short) +
               " of the run's refusals came from the device itself (its free memory was below the request: other "
               "processes, or memory no hook sees), which the replay does not simulate";
      if (trace.dropped || trace.truncated) why += "; the trace is incomplete (see above)";
      if (trace.unmatched_frees)
        why += "; " + std::to_string(trace.unmatched_frees) + " frees of allocations the trace lacks (" +
               (trace.dropped ? "their allocations were among the dropped events" : "a trace of an older gpushim: memory it did not record") +
               ")";
      if (why.empty()) why = "; nothing the trace records explains it";
      notes.push_back(head + why);
    }
  }

  if (cli.has("--json")) {
    std::string j = "{\"trace\":";
    append_json_string(&j, path);
    j += ",\"recorded_policy\":";
    append_json_string(&j, trace.header.policy);
    j += ",\"events\":" + std::to_string(trace.events.size()) + ",\"gpu_time\":";
    append_json_string(&j, gpu_time_name(base.gpu_time));
    j += ",\"policies\":[";
    for (size_t i = 0; i < results.size(); ++i) {
      const ReplayResult& r = results[i];
      j += std::string(i ? "," : "") + "{\"policy\":";
      append_json_string(&j, r.policy);
      j += ",\"available\":" + std::string(r.available ? "true" : "false");
      const double eps = r.seconds > 0 ? static_cast<double>(r.events) / r.seconds : 0;
      j += ",\"events\":" + std::to_string(r.events) + ",\"seconds\":" + std::to_string(r.seconds) +
           ",\"events_per_s\":" + std::to_string(eps) + ",\"devices\":[";
      for (size_t k = 0; k < r.devices.size(); ++k) {
        const ReplayDevice& d = r.devices[k];
        j += std::string(k ? "," : "") + "{\"device\":" + std::to_string(d.device) +
             ",\"capacity\":" + std::to_string(d.capacity) + ",\"limit\":" + std::to_string(d.limit) +
             ",\"allocs\":" + std::to_string(d.allocs) + ",\"frees\":" + std::to_string(d.frees) +
             ",\"peak_allocated\":" + std::to_string(d.peak_allocated) +
             ",\"peak_requested\":" + std::to_string(d.peak_requested) +
             ",\"peak_reserved\":" + std::to_string(d.peak_reserved) + ",\"utilization\":" + std::to_string(d.utilization()) +
             ",\"ooms\":" + std::to_string(d.ooms) + ",\"oom\":" + (d.ooms ? "true" : "false") +
             ",\"recorded_ooms\":" + std::to_string(d.recorded_ooms) + ",\"recorded_ooms_avoided\":" +
             std::to_string(d.recorded_ooms_avoided) +
             ",\"first_difference_event\":" + std::to_string(d.first_difference_event) +
             ",\"follows_recorded_reuse\":" + (d.follows_recorded_reuse ? "true" : "false") +
             ",\"fence_waits\":" + std::to_string(d.driver.fence_waits);
        if (base.gpu_time == GpuTime::kModel) {
          j += ",\"backlog_ns\":" + std::to_string(d.backlog_ns) + ",\"backlog_source\":";
          append_json_string(&j, d.backlog_source);
        }
        if (!d.difference.empty()) {
          j += ",\"difference\":";
          append_json_string(&j, d.difference);
        }
        if (d.ooms) {
          j += ",\"oom_event\":" + std::to_string(d.oom_event) + ",\"oom_t_s\":" + std::to_string(trace.seconds(d.oom_t_ns)) +
               ",\"oom_requested\":" + std::to_string(d.oom_requested) + ",\"oom_allocated\":" +
               std::to_string(d.oom_allocated) + ",\"oom_reserved\":" + std::to_string(d.oom_reserved) + ",\"oom_site\":";
          append_json_string(&j, first_site(sym, d.oom_stack));
        }
        j += ",\"driver_calls\":" + std::to_string(d.driver_calls()) + ",\"segment_allocs\":" +
             std::to_string(d.driver.segment_allocs) + ",\"segment_frees\":" + std::to_string(d.driver.segment_frees) +
             ",\"maps\":" + std::to_string(d.driver.maps) + ",\"unmaps\":" + std::to_string(d.driver.unmaps) +
             ",\"synchronizes\":" + std::to_string(d.driver.synchronizes) +
             (d.steady_synchronizes >= 0 ? ",\"steady_state_synchronizes\":" + std::to_string(d.steady_synchronizes) +
                                               ",\"steady_state_maps\":" + std::to_string(d.steady_maps) +
                                               ",\"steady_state_unmaps\":" + std::to_string(d.steady_unmaps)
                                         : "") +
             ",\"events_recorded\":" + std::to_string(d.driver.events_recorded) +
             // The rest of driver_calls, so that the listed calls add up to it.
             ",\"fences_recorded\":" + std::to_string(d.driver.fences_recorded) +
             ",\"physical_creates\":" + std::to_string(d.driver.physical_creates) +
             ",\"physical_releases\":" + std::to_string(d.driver.physical_releases) +
             ",\"va_reserves\":" + std::to_string(d.driver.va_reserves) +
             ",\"va_frees\":" + std::to_string(d.driver.va_frees) +
             ",\"forwarded_calls\":" + std::to_string(d.forwarded_calls);
        uint64_t rec = 0;
        if (recorded_known && r.policy == std::string(policy_name(recorded)) && recorded_peak(d.device, &rec))
          j += ",\"recorded_peak_allocated\":" + std::to_string(rec) + ",\"reproduces_recorded_peak\":" +
               (d.peak_allocated == rec ? "true" : "false");
        uint64_t shim = 0;
        if (shim_peak(d.device, &shim)) j += ",\"shim_peak_allocated\":" + std::to_string(shim);
        uint64_t rec_reserved = 0;
        if (recorded_known && r.policy == std::string(policy_name(recorded)) && shim_peak_reserved(d.device, &rec_reserved))
          j += ",\"recorded_peak_reserved\":" + std::to_string(rec_reserved);
        j += "}";
      }
      j += "]}";
    }
    j += "],\"notes\":[";
    for (size_t i = 0; i < notes.size(); ++i) {
      j += i ? "," : "";
      append_json_string(&j, notes[i]);
    }
    j += "]}\n";
    return print_output("replay", j);
  }

  std::string o = "replay of " + path + ": " + std::to_string(trace.events.size()) + " events, recorded with policy " +
                  trace.header.policy + (trace.end ? "" : " (no end record)") + "; GPU time: " +
                  gpu_time_name(base.gpu_time) + "\n";
  if (base.lags)
    for (const auto& [dev, lag] : *base.lags)
      o += "  device " + std::to_string(dev) + " backlog: " + lag.source() + "\n";
  for (const std::string& n : notes) o += "  note: " + n + "\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-18s %-6s %15s %15s %11s %13s %10s  %s\n", "policy", "device", "peak allocated",
                "peak reserved", "utilization", "driver calls", "events/s", "OOM");
  o += line;
  std::string reproduction;
  for (const ReplayResult& r : results) {
    if (!r.available) {
      o += r.policy + ": not available in this build\n";
      continue;
    }
    const double eps = r.seconds > 0 ? static_cast<double>(r.events) / r.seconds : 0;
    for (const ReplayDevice& d : r.devices) {
      std::string oom = "no";
      if (d.ooms) {
        char buf[256];
        std::snprintf(buf, sizeof(buf), "yes: event %" PRIu64 " at %.3f s, %s requested with %s allocated / %s reserved",
                      d.oom_event, trace.seconds(d.oom_t_ns), human_bytes(d.oom_requested).c_str(),
                      human_bytes(d.oom_allocated).c_str(), human_bytes(d.oom_reserved).c_str());
        oom = buf;
        oom += " (" + first_site(sym, d.oom_stack) + ")";
        if (d.ooms > 1) oom += "; " + std::to_string(d.ooms) + " refused in all";
      }
      if (d.recorded_ooms_avoided)
        oom += (d.ooms ? "; " : " (") + std::to_string(d.recorded_ooms_avoided) + " of the " +
               std::to_string(d.recorded_ooms) + " recorded OOMs would not happen" + (d.ooms ? "" : ")");
      char util[32];
      std::snprintf(util, sizeof(util), "%.1f%%", 100 * d.utilization());
      // The fixed columns only: the OOM's site has no bound (a C++ template, a long Python name),
      // and cut by the buffer it took the row's newline with it.
      std::snprintf(line, sizeof(line), "%-18s %-6d %15s %15s %11s %13" PRIu64 " %10s  ", r.policy.c_str(), d.device,
                    human_bytes(d.peak_allocated).c_str(), human_bytes(d.peak_reserved).c_str(), util, d.driver_calls(),
                    fmt_rate(eps).c_str());
      o += line + oom + "\n";
      uint64_t rec = 0;
      if (recorded_known && r.policy == std::string(policy_name(recorded)) && base.gpu_time == GpuTime::kModel &&
          shim_peak_reserved(d.device, &rec) && rec) {
        char buf[256];
        std::snprintf(buf, sizeof(buf), "recorded peak reserved on device %d: %s; the %s replay under the model gives %s (%+.1f%%)\n",
                      d.device, human_bytes(rec).c_str(), r.policy.c_str(), human_bytes(d.peak_reserved).c_str(),
                      100.0 * (static_cast<double>(d.peak_reserved) - static_cast<double>(rec)) / static_cast<double>(rec));
        reproduction += buf;
      } else if (recorded_known && r.policy == std::string(policy_name(recorded)) && recorded_peak(d.device, &rec) &&
                 base.gpu_time == GpuTime::kRecorded) {
        reproduction += "recorded peak allocated on device " + std::to_string(d.device) + ": " + human_bytes(rec) + " (" +
                        std::to_string(rec) + " B); the " + r.policy + " replay gives " + std::to_string(d.peak_allocated) +
                        " B: " + (d.peak_allocated == rec ? "reproduced exactly" : "DIFFERENT") +
                        (config_changed || base.limit_given ? " (settings changed for the replay)" : "") + "\n";
        uint64_t shim = 0;
        if (shim_peak(d.device, &shim) && shim != rec)
          reproduction += "  (the shim's own counter says " + std::to_string(shim) + " B: " +
                          (trace.dropped ? std::string("the trace lacks the events it dropped")
                                         : std::string("with concurrent allocation its updates are not in one order with the pool's")) +
                          ")\n";
      }
    }
  }
  o += reproduction;
  return print_output("replay", o);
}

}  // namespace

const CommandSpec kReplayCommand{
    .name = "replay",
    .operands = "TRACE",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "the trace's allocations through each policy on a simulated device: peak reserved, "
               "utilization, OOMs, driver calls",
    .description = R"(Replays the recorded allocation sequence through each policy on a simulated device. The pools are
the shim's own (policy_factory over SimBackend), configured as the trace was recorded (its
GPUSHIM_* settings) unless --set says otherwise. Per policy and device it prints:
  peak allocated   highest bytes handed to the program (policy rounding included)
  peak reserved    highest bytes held from the device (what nvidia-smi would show)
  utilization      peak allocated / peak reserved (1 - fragmentation)
  OOM              whether the simulated device or the cap refused an allocation, and the first
                   such event (index in the trace, time, size, call site)
  driver calls     segment allocs/frees, maps/unmaps, synchronizations and events the pool needed
  events/s         replay throughput
For the policy the trace was recorded with, it also says whether the replay reproduces the
recorded peak allocated exactly.
)",
    .options =
        {
            {.name = "--policy",
             .kind = ValueKind::kChoice,
             .value_name = "P",
             .help = "a policy, or a baseline: our own implementation of PyTorch's allocator rules "
                     "(docs/policies.md). Default: every policy this build offers, then both baselines",
             .choices =
                 {
                     {"passthrough", "every call goes to CUDA"},
                     {"caching", "the shim's caching pool"},
                     {"vmm", "the shim's virtual-memory pool (when this build has it)"},
                     {"pytorch", "PyTorch's CUDA caching allocator, default settings"},
                     {"pytorch-expandable", "the same with expandable_segments:True"},
                 },
             .repeatable = true},
            {.name = "--limit",
             .kind = ValueKind::kText,
             .value_name = "L",
             .help = "cap per device, as GPUSHIM_LIMIT takes it (8GiB, 60%), or none. Default: the cap the "
                     "trace was recorded with"},
            {.name = "--capacity",
             .kind = ValueKind::kBytes,
             .value_name = "B",
             .help = "simulated device size. Default: the recorded device's capacity"},
            {.name = "--set",
             .kind = ValueKind::kText,
             .value_name = "N=V",
             .help = "override one recorded GPUSHIM_* setting (e.g. --set GPUSHIM_ROUND=1MiB); the cap and the "
                     "policies are --limit's and --policy's",
             .repeatable = true},
            {.name = "--stream-ordered",
             .help = "replay every allocation and free as stream-ordered (cudaMallocAsync and cudaFreeAsync on "
                     "its recorded stream): what PyTorch's backend:cudaMallocAsync (gpushim run --torch-alloc "
                     "async) makes of tensors recorded as cudaMalloc/cudaFree"},
            {.name = "--gpu-time",
             .kind = ValueKind::kChoice,
             .value_name = "T",
             .help = "when the simulated device finishes the work queued before a pool's fence or stream-ordered "
                     "event, i.e. when freed memory becomes idle (docs/trace-format.md, \"GPU time in replay\"):",
             .fallback = "model",
             .choices =
                 {
                     {"model",
                      "every policy alike, the recorded one included: work queued at host time t is done at t + "
                      "the device's backlog, measured from the trace's reuse events (record time vs. the time the "
                      "run saw it complete), or, for traces without them, a typical training backlog (5% of "
                      "the median step, or 1 ms without iteration marks); the output says which"},
                     {"recorded",
                      "the recorded policy completes them exactly where the run saw them complete (an exact "
                      "reproduction); other policies as instant"},
                     {"instant", "at once: an infinitely fast device"},
                 }},
            {.name = "--json", .help = "machine-readable output"},
        },
    .run = run_replay,
};

}  // namespace gpushim::analysis
