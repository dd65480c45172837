// Perfetto's own trace format (protobuf; protos/perfetto/trace/trace.proto): a native heap profile
// that ui.perfetto.dev shows as a flame graph, and counter tracks with byte units.
//
// What is written, with the messages and field numbers of the published .proto files:
//   - ClockSnapshot: CLOCK_MONOTONIC (what the shim's trace times are), MONOTONIC_COARSE (the heap
//     dumps' clock) and BOOTTIME (the trace clock) as one, so every time lands where it happened.
//   - TrackDescriptors: the process (pid, name), and under it one counter track per device and
//     figure ("device 0 allocated", "reserved", "cap") with CounterDescriptor.unit =
//     UNIT_SIZE_BYTES; TrackEvents of TYPE_COUNTER on them; TYPE_INSTANT events for OOMs and
//     iteration marks.
//   - ProfilePackets (heapprofd's message): interned strings, mappings (one per module), frames
//     (function (file:line), module-relative pc) and callstacks (outermost frame first), and per
//     device a ProcessHeapSamples ("heap" = "cuda device N") with each callstack's bytes and counts
//     allocated and freed so far. Traces get two dumps, at the device's peak allocated and at the
//     end, so the flame graph can show either; a report gets one, of what is live.
#include <algorithm>
#include <cinttypes>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "exports.h"
#include "offline_symbolizer.h"
#include "trace/trace_format.h"
#include "util/version.h"

namespace gpushim::analysis {
namespace {

// ---- protobuf wire format: varints and length-delimited fields, nothing else is needed. The
// varints are the trace format's own (trace_format.h), so gpushim has one encoder. ----
class Message {
 public:
  void varint(uint32_t field, uint64_t v) {
    trace::put_varint(&out_, (static_cast<uint64_t>(field) << 3) | 0);
    trace::put_varint(&out_, v);
  }
  void sint(uint32_t field, int64_t v) { varint(field, static_cast<uint64_t>(v)); }  // int64: two's complement
  void bytes(uint32_t field, const std::string& s) {
    trace::put_varint(&out_, (static_cast<uint64_t>(field) << 3) | 2);
    trace::put_string(&out_, s);
  }
  void message(uint32_t field, const Message& m) { bytes(field, m.out_); }
  const std::string& data() const { return out_; }

 private:
  std::string out_;
};

// Field numbers, from the .proto files named beside each group.
namespace tp {  // trace_packet.proto, trace.proto
constexpr uint32_t kTracePacket = 1, kTimestamp = 8, kSequenceId = 10, kSequenceFlags = 13, kClockSnapshot = 6,
                   kTrackEvent = 11, kTrackDescriptor = 60, kProfilePacket = 37, kProcessTree = 2;
constexpr uint64_t kSeqIncrementalStateCleared = 1;
}  // namespace tp
namespace clk {  // clock_snapshot.proto, builtin_clock.proto
constexpr uint32_t kClocks = 1, kClockId = 1, kClockTimestamp = 2;
constexpr uint64_t kMonotonic = 3, kMonotonicCoarse = 4, kBoottime = 6;
}  // namespace clk
namespace td {  // track_descriptor.proto, process_descriptor.proto, counter_descriptor.proto
constexpr uint32_t kUuid = 1, kParentUuid = 5, kName = 2, kProcess = 3, kCounter = 8;
constexpr uint32_t kPid = 1, kProcessName = 6;
constexpr uint32_t kUnit = 3;
constexpr uint64_t kUnitSizeBytes = 3;
}  // namespace td
namespace te {  // track_event.proto
constexpr uint32_t kType = 9, kTrackUuid = 11, kCounterValue = 30, kName = 23;
constexpr uint64_t kTypeInstant = 3, kTypeCounter = 4;
}  // namespace te
namespace pt {  // ps/process_tree.proto
constexpr uint32_t kProcesses = 1, kPid = 1, kPpid = 2, kCmdline = 3;
}  // namespace pt
namespace pp {  // profiling/profile_packet.proto, profiling/profile_common.proto
constexpr uint32_t kStrings = 1, kFrames = 2, kCallstacks = 3, kMappings = 4, kProcessDumps = 5, kContinued = 6,
                   kIndex = 7;
constexpr uint32_t kIid = 1, kStr = 2;                                                  // InternedString
constexpr uint32_t kMapBuildId = 2, kMapStart = 4, kMapEnd = 5, kMapPath = 7;           // Mapping
constexpr uint32_t kFrameName = 2, kFrameMapping = 3, kFrameRelPc = 4;                  // Frame
constexpr uint32_t kCallstackFrames = 2;                                                // Callstack
constexpr uint32_t kDumpPid = 1, kDumpSamples = 2, kDumpTimestamp = 9, kDumpHeapName = 11;  // ProcessHeapSamples
constexpr uint32_t kSampleCallstack = 1, kSampleAllocated = 2, kSampleFreed = 3, kSampleTimestamp = 4,
                   kSampleAllocCount = 5, kSampleFreeCount = 6;                        // HeapSample
}  // namespace pp

constexpr uint32_t kSequence = 1;  // one writer, one sequence

std::string base_name(const std::string& p) {
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// A frame as the flame graph names it: the function with its file:line, so lines stay apart.
std::string frame_name(const FrameInfo& f) {
  std::string s = f.function.empty() ? (f.python ? "<python>" : "??") : f.function;
  if (!f.file.empty() && f.line > 0) s += " (" + base_name(f.file) + ":" + std::to_string(f.line) + ")";
  return s;
}

struct Totals {
  uint64_t allocated = 0, freed = 0, allocs = 0, frees = 0;
};

// The interning tables of one ProfilePacket.
class Interner {
 public:
  uint64_t string(const std::string& s) {
    auto [it, fresh] = strings_.emplace(s, strings_.size() + 1);
    if (fresh) {
      Message m;
      m.varint(pp::kIid, it->second);
      m.bytes(pp::kStr, s);
      packet_.message(pp::kStrings, m);
    }
    return it->second;
  }
  uint64_t mapping(const std::string& path) {
    auto it = mappings_.find(path);
    if (it != mappings_.end()) return it->second;
    const uint64_t build_id = string("");  // unknown: the trace processor still needs the string
    std::vector<uint64_t> parts;
    size_t at = 0;
    while (at <= path.size()) {
      const size_t slash = path.find('/', at);
      const std::string part = path.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
      if (!part.empty()) parts.push_back(string(part));
      if (slash == std::string::npos) break;
      at = slash + 1;
    }
    const uint64_t id = mappings_.size() + 1;
    mappings_.emplace(path, id);
    Message m;
    m.varint(pp::kIid, id);
    m.varint(pp::kMapBuildId, build_id);
    m.varint(pp::kMapStart, 0);
    m.varint(pp::kMapEnd, 0);
    for (uint64_t p : parts) m.varint(pp::kMapPath, p);
    packet_.message(pp::kMappings, m);
    return id;
  }
  uint64_t frame(const FrameInfo& f) {
    // Python frames have no address: each distinct one gets its own pc in a "[python]" mapping.
    const std::string module = f.python ? "[python]" : (f.module.empty() ? "[unknown]" : f.module);
    const std::string name = frame_name(f);
    const std::string key = module + '\x1f' + name + '\x1f' + std::to_string(f.python ? 0 : f.module_offset);
    auto it = frames_.find(key);
    if (it != frames_.end()) return it->second;
    const uint64_t id = frames_.size() + 1;
    frames_.emplace(key, id);
    Message m;
    m.varint(pp::kIid, id);
    m.varint(pp::kFrameName, string(name));
    m.varint(pp::kFrameMapping, mapping(module));
    m.varint(pp::kFrameRelPc, f.python ? ++python_pcs_ : f.module_offset);
    packet_.message(pp::kFrames, m);
    return id;
  }
  // Frames innermost first, as gpushim keeps them; the callstack lists them outermost first.
  uint64_t callstack(const std::vector<FrameInfo>& frames) {
    std::vector<uint64_t> ids;
    for (auto it = frames.rbegin(); it != frames.rend(); ++it)
      if (!is_plumbing_frame(*it)) ids.push_back(frame(*it));
    if (ids.empty()) ids.push_back(frame(FrameInfo{"(no stack)", "", 0, "", 0, 0, false}));
    auto [it, fresh] = callstacks_.emplace(ids, callstacks_.size() + 1);
    if (fresh) {
      Message m;
      m.varint(pp::kIid, it->second);
      for (uint64_t id : ids) m.varint(pp::kCallstackFrames, id);
      packet_.message(pp::kCallstacks, m);
    }
    return it->second;
  }
  Message& packet() { return packet_; }

 private:
  std::map<std::string, uint64_t> strings_, mappings_, frames_;
  std::map<std::vector<uint64_t>, uint64_t> callstacks_;
  uint64_t python_pcs_ = 0;
  Message packet_;
};

class Writer {
 public:
  explicit Writer(uint64_t t0_ns) : t0_ns_(t0_ns) {
    Message snap;
    for (uint64_t id : {clk::kBoottime, clk::kMonotonic, clk::kMonotonicCoarse}) {
      Message c;
      c.varint(clk::kClockId, id);
      c.varint(clk::kClockTimestamp, t0_ns);
      snap.message(clk::kClocks, c);
    }
    Message p;
    p.varint(tp::kTimestamp, t0_ns);
    p.message(tp::kClockSnapshot, snap);
    add(p, /*first=*/true);
  }
  void add(Message& packet, bool first = false) {
    packet.varint(tp::kSequenceId, kSequence);
    if (first) packet.varint(tp::kSequenceFlags, tp::kSeqIncrementalStateCleared);
    out_.message(tp::kTracePacket, packet);
  }
  void track(uint64_t uuid, uint64_t parent, const std::string& name, const Message* extra_field, uint32_t extra_no) {
    Message d;
    d.varint(td::kUuid, uuid);
    if (parent) d.varint(td::kParentUuid, parent);
    if (!name.empty()) d.bytes(td::kName, name);
    if (extra_field) d.message(extra_no, *extra_field);
    Message p;
    p.varint(tp::kTimestamp, t0_ns_);
    p.message(tp::kTrackDescriptor, d);
    add(p);
  }
  void counter(uint64_t uuid, uint64_t t_ns, uint64_t value) {
    Message e;
    e.varint(te::kType, te::kTypeCounter);
    e.varint(te::kTrackUuid, uuid);
    e.sint(te::kCounterValue, static_cast<int64_t>(value));
    Message p;
    p.varint(tp::kTimestamp, t_ns);
    p.message(tp::kTrackEvent, e);
    add(p);
  }
  void instant(uint64_t uuid, uint64_t t_ns, const std::string& name) {
    Message e;
    e.varint(te::kType, te::kTypeInstant);
    e.varint(te::kTrackUuid, uuid);
    e.bytes(te::kName, name);
    Message p;
    p.varint(tp::kTimestamp, t_ns);
    p.message(tp::kTrackEvent, e);
    add(p);
  }
  std::string take() { return out_.data(); }

 private:
  uint64_t t0_ns_;
  Message out_;
};

constexpr uint64_t kProcessTrack = 1;
uint64_t counter_track(int device, int figure) { return 0x1000 + static_cast<uint64_t>(device) * 8 + static_cast<uint64_t>(figure); }
constexpr uint64_t kMarksTrack = 2;

void describe_process(Writer& w, const ReportData& m, uint64_t t0_ns, const std::vector<int>& devices,
                      const std::map<int, uint64_t>& limits) {
  Message tree, proc;
  proc.varint(pt::kPid, static_cast<uint64_t>(m.pid));
  proc.varint(pt::kPpid, 0);
  proc.bytes(pt::kCmdline, m.exe);
  tree.message(pt::kProcesses, proc);
  Message p;
  p.varint(tp::kTimestamp, t0_ns);
  p.message(tp::kProcessTree, tree);
  w.add(p);
  Message pd;
  pd.varint(td::kPid, static_cast<uint64_t>(m.pid));
  pd.bytes(td::kProcessName, base_name(m.exe) + " (gpushim)");
  w.track(kProcessTrack, 0, "", &pd, td::kProcess);
  Message bytes_unit;
  bytes_unit.varint(td::kUnit, td::kUnitSizeBytes);
  static const char* kFigures[] = {"allocated", "reserved", "cap"};
  for (int d : devices)
    for (int f = 0; f < 3; ++f)
      if (f < 2 || limits.count(d))
        w.track(counter_track(d, f), kProcessTrack, "device " + std::to_string(d) + " " + kFigures[f], &bytes_unit,
                td::kCounter);
  w.track(kMarksTrack, kProcessTrack, "gpushim events", nullptr, 0);
}

// The counter tracks (allocated and reserved over `timeline`, the cap as a flat line over the run)
// and an instant per OOM: the same for a trace and a report.
void write_counters_and_ooms(Writer& w, const ReportData& m, uint64_t t0, uint64_t end,
                             const std::vector<TimelineSample>& timeline, const std::map<int, uint64_t>& limits) {
  for (const TimelineSample& s : timeline) {
    const uint64_t t = t0 + static_cast<uint64_t>(s.t_s * 1e9);
    w.counter(counter_track(s.device, 0), t, s.allocated);
    w.counter(counter_track(s.device, 1), t, s.reserved);
  }
  for (const auto& [d, limit] : limits) {
    w.counter(counter_track(d, 2), t0, limit);
    w.counter(counter_track(d, 2), end, limit);
  }
  for (const OomReport& o : m.ooms)
    w.instant(kMarksTrack, t0 + static_cast<uint64_t>(o.t_s * 1e9),
              "OOM on device " + std::to_string(o.device) + ": " + human_bytes(o.requested) + " requested");
}


Message heap_dump(int pid, int device, uint64_t t_ns, const std::map<uint64_t, Totals>& by_callstack) {
  Message dump;
  dump.varint(pp::kDumpPid, static_cast<uint64_t>(pid));
  dump.varint(pp::kDumpTimestamp, t_ns);
  dump.bytes(pp::kDumpHeapName, "cuda device " + std::to_string(device));
  for (const auto& [cs, t] : by_callstack) {
    Message s;
    s.varint(pp::kSampleCallstack, cs);
    s.varint(pp::kSampleAllocated, t.allocated);
    s.varint(pp::kSampleFreed, t.freed);
    s.varint(pp::kSampleTimestamp, t_ns);
    s.varint(pp::kSampleAllocCount, t.allocs);
    s.varint(pp::kSampleFreeCount, t.frees);
    dump.message(pp::kDumpSamples, s);
  }
  return dump;
}

// The process, its tracks, the counters over `timeline` and the OOMs: what a trace and a report
// both give. Returns the run's end on the trace clock.
uint64_t describe_run(Writer& w, const ReportData& m, uint64_t t0, const std::vector<TimelineSample>& timeline) {
  std::vector<int> devices;
  std::map<int, uint64_t> limits;
  for (const DeviceReport& d : m.devices) {
    devices.push_back(d.device);
    if (d.limit_bytes) limits[d.device] = d.limit_bytes;
  }
  describe_process(w, m, t0, devices, limits);
  const uint64_t end = t0 + static_cast<uint64_t>(m.duration_s * 1e9);
  write_counters_and_ooms(w, m, t0, end, timeline, limits);
  return end;
}

// Heap dump `i` of `n`, one packet per instant: the first carries the interning tables, the later
// ones refer to them (continued=true keeps the trace processor from dropping the tables between).
void add_profile_packet(Writer& w, Interner& in, size_t i, size_t n, uint64_t t_ns, const Message& dump) {
  Message packet = i == 0 ? in.packet() : Message();
  packet.message(pp::kProcessDumps, dump);
  packet.varint(pp::kContinued, i + 1 < n ? 1 : 0);
  packet.varint(pp::kIndex, i);
  Message p;
  p.varint(tp::kTimestamp, t_ns);
  p.message(tp::kProfilePacket, packet);
  w.add(p);
}

}  // namespace

std::string perfetto_proto_from_trace(const TraceData& trace, size_t max_points_per_device) {
  RunView run;
  run_from_trace(trace, "", &run);
  const ReportData& m = run.meta;
  const uint64_t t0 = trace.header.start_mono_ns;
  Writer w(t0);
  const uint64_t end = describe_run(w, m, t0, trace_timeline(trace, max_points_per_device));
  for (size_t i = 0; i < run.iterations_s.size(); ++i)
    w.instant(kMarksTrack, t0 + static_cast<uint64_t>(run.iterations_s[i] * 1e9), "iteration " + std::to_string(i + 1));

  // The heap profile: cumulative totals per (device, callstack), dumped at each device's peak
  // allocated and at the end.
  OfflineSymbolizer sym(trace);
  Interner in;
  absl::flat_hash_map<uint32_t, uint64_t> callstack_of;  // trace stack id -> callstack iid
  auto device_memory = [](const TraceEvent& e) {
    return (e.kind == EventKind::kAlloc || e.kind == EventKind::kFree) &&
           (e.flags & trace::kFlagKindMask) == static_cast<uint8_t>(MemoryKind::kDevice);
  };
  // First pass: the event at which each device reached its peak allocated.
  std::map<int, uint64_t> level, peak_level;
  std::map<int, size_t> peak_event;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (!device_memory(e)) continue;
    uint64_t& l = level[e.device];
    if (e.kind == EventKind::kAlloc) {
      l += e.size;
      if (l > peak_level[e.device]) peak_level[e.device] = l, peak_event[e.device] = i;
    } else {
      l -= std::min(l, e.size);
    }
  }
  // Second pass: cumulative totals per callstack, copied at each peak.
  std::map<int, std::map<uint64_t, Totals>> totals;
  std::vector<std::pair<uint64_t, Message>> dumps;  // (time, dump)
  std::map<int, uint64_t> peak_time;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (!device_memory(e)) continue;
    auto [it, fresh] = callstack_of.emplace(e.stack, 0);
    if (fresh) it->second = in.callstack(sym.stack(e.stack));
    Totals& t = totals[e.device][it->second];
    if (e.kind == EventKind::kAlloc) t.allocated += e.size, ++t.allocs;
    else t.freed += e.size, ++t.frees;
    auto peak = peak_event.find(e.device);
    if (peak != peak_event.end() && peak->second == i) {
      dumps.emplace_back(e.t_ns, heap_dump(m.pid, e.device, e.t_ns, totals[e.device]));
      peak_time[e.device] = e.t_ns;
    }
  }
  const uint64_t last = trace.events.empty() ? end : std::max(end, trace.events.back().t_ns);
  for (const auto& [d, t] : totals)
    if (!peak_time.count(d) || peak_time[d] != last) dumps.emplace_back(last, heap_dump(m.pid, d, last, t));
  std::stable_sort(dumps.begin(), dumps.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < dumps.size(); ++i) add_profile_packet(w, in, i, dumps.size(), dumps[i].first, dumps[i].second);
  return w.take();
}

std::string perfetto_proto_from_run(const RunView& run) {
  const ReportData& m = run.meta;
  // A report's times are seconds since the shim started; put that start at 1 s of trace time.
  constexpr uint64_t t0 = 1000000000ull;
  Writer w(t0);
  const uint64_t end = describe_run(w, m, t0, m.timeline);
  // What is live at the end, by site: a report knows no frees, so the dump holds live bytes only.
  Interner in;
  std::map<int, std::map<uint64_t, Totals>> live;
  for (const SiteView& s : run.sites) {
    if (s.kind != "device" || s.live_bytes == 0) continue;
    Totals& t = live[s.device][in.callstack(s.frames)];
    t.allocated += s.live_bytes, t.allocs += s.live_count;
  }
  size_t i = 0;
  for (const auto& [d, totals] : live) add_profile_packet(w, in, i++, live.size(), end, heap_dump(m.pid, d, end, totals));
  return w.take();
}

}  // namespace gpushim::analysis
