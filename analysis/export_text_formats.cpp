// Folded stacks, Chrome Trace Event JSON (Perfetto) and the plot timeline.
#include <algorithm>
#include <cinttypes>
#include <map>

#include "exports.h"
#include "json.h"
#include "offline_symbolizer.h"
#include "util/version.h"
#include "util/paths.h"

namespace gpushim::analysis {
namespace {

// One frame of a folded line: the function name (or module+offset). A Python function keeps its
// file, as `forward` is a method of every module; `lines` adds the line, so that two lines of one
// function become two frames (flamegraph.pl would draw them as siblings otherwise merged). ';'
// separates frames and a line ends with " <count>", so neither may appear raw.
std::string folded_frame(const FrameInfo& f, bool lines) {
  std::string s;
  const std::string line = lines && f.line > 0 ? ":" + std::to_string(f.line) : "";
  if (f.python) {
    s = (f.function.empty() ? "<python>" : f.function) + " (" + file_name_of(f.file) + line + ")";
  } else if (!f.function.empty()) {
    s = f.function;
    if (lines && !f.file.empty() && f.line > 0) s += " (" + file_name_of(f.file) + line + ")";
  } else {
    FrameInfo bare = f;
    bare.file.clear();
    s = describe_frame(bare);
  }
  for (char& c : s)
    if (c == ';' || c == '\n' || c == '\r') c = ':';
  return s;
}

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

}  // namespace

std::string folded_from_run(const RunView& run, bool at_peak, bool lines) {
  std::map<std::string, uint64_t> stacks;
  for (const SiteView& s : run.sites) {
    const uint64_t weight = at_peak ? s.at_device_peak_bytes : s.live_bytes;
    if (weight == 0) continue;
    std::string line;
    for (auto it = s.frames.rbegin(); it != s.frames.rend(); ++it) {  // outermost first
      if (is_plumbing_frame(*it)) continue;
      if (!line.empty()) line += ';';
      line += folded_frame(*it, lines);
    }
    if (line.empty()) line = "(no stack)";
    stacks[line] += weight;
  }
  std::string out;
  for (const auto& [stack, bytes] : stacks) out += stack + " " + std::to_string(bytes) + "\n";
  return out;
}

std::string speedscope_from_run(const RunView& run, bool at_peak, bool lines) {
  // speedscope's file format (https://www.speedscope.app/file-format-schema.json): one sampled
  // profile per device and memory kind, each site a "sample" (its stack, outermost first) weighed
  // in bytes, so the viewer says "MB" where folded stacks make it say "samples".
  std::vector<std::string> frame_keys;
  std::map<std::string, size_t> frame_index;
  std::string frames_json;
  auto frame_of = [&](const FrameInfo& f) {
    const std::string name = folded_frame(f, lines);
    // Without `lines`, one frame per function and file: the line of its first site would mislead.
    const std::string key = name + "\x1f" + f.file + "\x1f" + (lines ? std::to_string(f.line) : "");
    auto [it, fresh] = frame_index.emplace(key, frame_index.size());
    if (fresh) {
      frames_json += frames_json.empty() ? "" : ",";
      frames_json += "{\"name\":";
      append_json_string(&frames_json, name);
      if (!f.file.empty()) {
        frames_json += ",\"file\":";
        append_json_string(&frames_json, f.file);
        if (lines && f.line > 0) frames_json += ",\"line\":" + std::to_string(f.line);
      } else if (!f.module.empty()) {
        frames_json += ",\"file\":";
        append_json_string(&frames_json, f.module);
      }
      frames_json += "}";
    }
    return it->second;
  };
  struct Profile {
    std::string samples, weights;
    uint64_t total = 0;
  };
  std::map<std::pair<std::string, int>, Profile> profiles;  // (kind, device)
  for (const SiteView& s : run.sites) {
    const uint64_t weight = at_peak ? s.at_device_peak_bytes : s.live_bytes;
    if (weight == 0) continue;
    std::string stack;
    for (auto it = s.frames.rbegin(); it != s.frames.rend(); ++it) {
      if (is_plumbing_frame(*it)) continue;
      stack += (stack.empty() ? "" : ",") + std::to_string(frame_of(*it));
    }
    if (stack.empty()) stack = std::to_string(frame_of(FrameInfo{"(no stack)", "", 0, "", 0, 0, false}));
    Profile& p = profiles[{s.kind, s.kind == "device" ? s.device : -1}];
    p.samples += (p.samples.empty() ? "[" : ",[") + stack + "]";
    p.weights += (p.weights.empty() ? "" : ",") + std::to_string(weight);
    p.total += weight;
  }
  // Nothing held (a clean run's report, a trace cut before its first allocation): speedscope
  // refuses a file without a profile ("imported nothing"), and accepts empty ones.
  if (profiles.empty()) {
    for (const DeviceReport& d : run.meta.devices) profiles[{"device", d.device}];
    if (profiles.empty()) profiles[{"device", 0}];
  }
  const std::string what = at_peak ? "held at the device's peak" : run.meta.reason == "snapshot" ? "live at the snapshot" : "live at the end";
  std::string j = "{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\"exporter\":";
  append_json_string(&j, std::string("gpushim-analyze ") + kVersion);
  j += ",\"name\":";
  append_json_string(&j, file_name_of(run.meta.exe) + " (pid " + std::to_string(run.meta.pid) + "): bytes " + what);
  j += ",\"activeProfileIndex\":0,\"shared\":{\"frames\":[" + frames_json + "]},\"profiles\":[";
  bool first = true;
  for (const auto& [key, p] : profiles) {
    j += first ? "" : ",";
    first = false;
    j += "{\"type\":\"sampled\",\"name\":";
    append_json_string(&j, (key.first == "device" ? "device " + std::to_string(key.second) : key.first + " memory") + ": bytes " + what);
    j += ",\"unit\":\"bytes\",\"startValue\":0,\"endValue\":" + std::to_string(p.total) + ",\"samples\":[" + p.samples +
         "],\"weights\":[" + p.weights + "]}";
  }
  j += "]}\n";
  return j;
}

namespace {

// Chrome Trace Event Format pieces.
void begin_event(std::string* j, bool* first) {
  if (!*first) *j += ",\n";
  *first = false;
}

std::string perfetto_document(const ReportData& m, const std::vector<TimelineSample>& timeline,
                              const std::vector<OomReport>& ooms, const std::vector<double>& iterations) {
  std::string j = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"gpushim-analyze\",\"policy\":";
  append_json_string(&j, m.policy);
  j += ",\"exe\":";
  append_json_string(&j, m.exe);
  j += "},\"traceEvents\":[\n";
  bool first = true;
  const std::string pid = std::to_string(m.pid);
  begin_event(&j, &first);
  j += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":";
  append_json_string(&j, file_name_of(m.exe) + " (gpushim)");
  j += "}}";
  std::map<int, uint64_t> limits;
  for (const DeviceReport& d : m.devices)
    if (d.limit_bytes) limits[d.device] = d.limit_bytes;
  std::map<int, double> last_t;
  // Allocated and reserved as two counters: Chrome's trace viewer stacks the values of one
  // counter's args (allocated would be drawn on top of reserved, as if added to it).
  for (const TimelineSample& s : timeline) {
    for (const auto& [what, value] : {std::pair<const char*, uint64_t>{"allocated", s.allocated}, {"reserved", s.reserved}}) {
      begin_event(&j, &first);
      j += "{\"name\":\"device " + std::to_string(s.device) + " " + what + "\",\"ph\":\"C\",\"ts\":" +
           number(s.t_s * 1e6) + ",\"pid\":" + pid + ",\"args\":{\"" + what + "\":" + std::to_string(value) + "}}";
    }
    last_t[s.device] = s.t_s;
  }
  // The cap as its own track, flat over the run.
  for (const auto& [dev, limit] : limits) {
    for (double t : {0.0, std::max(last_t[dev], m.duration_s)}) {
      begin_event(&j, &first);
      j += "{\"name\":\"device " + std::to_string(dev) + " cap\",\"ph\":\"C\",\"ts\":" + number(t * 1e6) + ",\"pid\":" + pid +
           ",\"args\":{\"cap\":" + std::to_string(limit) + "}}";
    }
  }
  for (const OomReport& o : ooms) {
    begin_event(&j, &first);
    j += "{\"name\":\"OOM on device " + std::to_string(o.device) + "\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" +
         number(o.t_s * 1e6) + ",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"requested\":" + std::to_string(o.requested) +
         ",\"allocated\":" + std::to_string(o.allocated) + ",\"reserved\":" + std::to_string(o.reserved) +
         ",\"device_free\":" + std::to_string(o.device_free) + ",\"site\":";
    append_json_string(&j, describe_site(o.frames, "unknown"));
    j += "}}";
  }
  for (size_t i = 0; i < iterations.size(); ++i) {
    begin_event(&j, &first);
    j += "{\"name\":\"iteration " + std::to_string(i + 1) + "\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" +
         number(iterations[i] * 1e6) + ",\"pid\":" + pid + ",\"tid\":0}";
  }
  j += "\n]}\n";
  return j;
}

}  // namespace

std::string perfetto_from_trace(const TraceData& trace, size_t max_points_per_device) {
  RunView run;
  run_from_trace(trace, "", &run);
  return perfetto_document(run.meta, trace_timeline(trace, max_points_per_device), run.meta.ooms, run.iterations_s);
}

std::string perfetto_from_run(const RunView& run) {
  return perfetto_document(run.meta, run.meta.timeline, run.meta.ooms, run.iterations_s);
}

std::string timeline_json(const RunView& run, const std::vector<TimelineSample>& timeline) {
  const ReportData& m = run.meta;
  std::string j;
  append_run_header_json(&j, run);
  j += ",\"devices\":[";
  for (size_t i = 0; i < m.devices.size(); ++i) {
    const DeviceReport& d = m.devices[i];
    j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(d.device) + ",\"capacity\":" +
         std::to_string(d.capacity_bytes) + ",\"limit\":" + std::to_string(d.limit_bytes) + ",\"peak_allocated\":" +
         std::to_string(d.peak_bytes) + ",\"peak_allocated_at_s\":" + number(d.peak_allocated_at_s) +
         ",\"peak_reserved\":" + std::to_string(d.peak_reserved_bytes) + ",\"live_at_end\":" +
         std::to_string(d.live_bytes) + ",\"reserved_at_end\":" + std::to_string(d.pool.reserved_bytes) + ",\"samples\":[";
    bool first = true;
    for (const TimelineSample& s : timeline) {
      if (s.device != d.device) continue;
      j += first ? "" : ",";
      first = false;
      char buf[96];
      std::snprintf(buf, sizeof(buf), "[%.6f,%" PRIu64 ",%" PRIu64 "]", s.t_s, s.allocated, s.reserved);
      j += buf;
    }
    j += "]}";
  }
  j += "],\"ooms\":[";
  for (size_t i = 0; i < m.ooms.size(); ++i) {
    const OomReport& o = m.ooms[i];
    j += std::string(i ? "," : "") + "{\"t_s\":" + number(o.t_s) + ",\"device\":" + std::to_string(o.device) +
         ",\"requested\":" + std::to_string(o.requested) + ",\"allocated\":" + std::to_string(o.allocated) + "}";
  }
  j += "],\"iterations\":[";
  for (size_t i = 0; i < run.iterations_s.size(); ++i) j += (i ? "," : "") + number(run.iterations_s[i]);
  // A Python program's live figures (live_at_end) are of the moment its interpreter's teardown
  // began: said, so that a plot names that moment rather than the curve's end.
  j += "],\"teardown_s\":" + (m.teardown.observed ? number(m.teardown.began_s) : std::string("null"));
  // The strongest growth suspects, named by the user's own frame (describe_site).
  j += ",\"growth\":[";
  for (size_t i = 0; i < run.growth.size() && i < 3; ++i) {
    const GrowthSuspect& g = run.growth[i];
    const std::string site = describe_site(g.frames, "unknown");
    j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(g.device) + ",\"grew_bytes\":" +
         std::to_string(g.grew_bytes) + ",\"bytes_per_iteration\":" + number(g.bytes_per_iteration) + ",\"site\":";
    append_json_string(&j, site);
    j += "}";
  }
  j += "]}\n";
  return j;
}

}  // namespace gpushim::analysis
