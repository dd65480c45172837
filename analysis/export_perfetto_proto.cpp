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

#include <protozero/pbf_builder.hpp>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "exports.h"
#include "json.h"
#include "offline_symbolizer.h"
#include "util/version.h"
#include "util/paths.h"

namespace gpushim::analysis {
namespace {

// The protobuf encoding is protozero's (libprotozero-dev, header-only): fields are written in place,
// nested messages included (no copy per nesting level), and each message's fields are an enum of
// their own below, so a field can only be written into the message it belongs to.
//
// Field numbers, from Perfetto's published .proto files (named beside each message): the one table.
namespace pf {
using protozero::pbf_tag_type;
enum class Trace : pbf_tag_type { kPacket = 1 };  // trace.proto
enum class TracePacket : pbf_tag_type {           // trace_packet.proto
  kProcessTree = 2, kClockSnapshot = 6, kTimestamp = 8, kTrustedPacketSequenceId = 10, kTrackEvent = 11,
  kSequenceFlags = 13, kProfilePacket = 37, kTrackDescriptor = 60
};
constexpr uint32_t kSeqIncrementalStateCleared = 1;
enum class ClockSnapshot : pbf_tag_type { kClocks = 1 };        // clock_snapshot.proto
enum class Clock : pbf_tag_type { kClockId = 1, kTimestamp = 2 };  // ClockSnapshot.Clock
constexpr uint32_t kMonotonic = 3, kMonotonicCoarse = 4, kBoottime = 6;  // builtin_clock.proto
enum class TrackDescriptor : pbf_tag_type { kUuid = 1, kName = 2, kProcess = 3, kParentUuid = 5, kCounter = 8 };
enum class ProcessDescriptor : pbf_tag_type { kPid = 1, kProcessName = 6 };  // process_descriptor.proto
enum class CounterDescriptor : pbf_tag_type { kUnit = 3 };                    // counter_descriptor.proto
constexpr int32_t kUnitSizeBytes = 3;
enum class TrackEvent : pbf_tag_type { kType = 9, kTrackUuid = 11, kName = 23, kCounterValue = 30 };
constexpr int32_t kTypeInstant = 3, kTypeCounter = 4;
enum class ProcessTree : pbf_tag_type { kProcesses = 1 };                 // ps/process_tree.proto
enum class Process : pbf_tag_type { kPid = 1, kPpid = 2, kCmdline = 3 };  // ProcessTree.Process
// profiling/profile_packet.proto, profiling/profile_common.proto
enum class ProfilePacket : pbf_tag_type {
  kStrings = 1, kFrames = 2, kCallstacks = 3, kMappings = 4, kProcessDumps = 5, kContinued = 6, kIndex = 7
};
enum class InternedString : pbf_tag_type { kIid = 1, kStr = 2 };
enum class Mapping : pbf_tag_type { kIid = 1, kBuildId = 2, kStart = 4, kEnd = 5, kPathStringIds = 7 };
enum class Frame : pbf_tag_type { kIid = 1, kFunctionNameId = 2, kMappingId = 3, kRelPc = 4 };
enum class Callstack : pbf_tag_type { kIid = 1, kFrameIds = 2 };
enum class ProcessHeapSamples : pbf_tag_type { kPid = 1, kSamples = 2, kTimestamp = 9, kHeapName = 11 };
enum class HeapSample : pbf_tag_type {
  kCallstackId = 1, kSelfAllocated = 2, kSelfFreed = 3, kTimestamp = 4, kAllocCount = 5, kFreeCount = 6
};
}  // namespace pf

template <typename Fields>
using Builder = protozero::pbf_builder<Fields>;

constexpr uint32_t kSequence = 1;  // one writer, one sequence

// A frame as the flame graph names it: the function with its file:line, so lines stay apart.
std::string frame_name(const FrameInfo& f) {
  std::string s = f.function.empty() ? (f.python ? "<python>" : "??") : f.function;
  if (!f.file.empty() && f.line > 0) s += " (" + file_name_of(f.file) + ":" + std::to_string(f.line) + ")";
  return s;
}

struct Totals {
  uint64_t allocated = 0, freed = 0, allocs = 0, frees = 0;
};

// The interning tables of one ProfilePacket, written as entries are first asked for.
class Interner {
 public:
  uint64_t string(const std::string& raw) {
    // bytes fields, but the trace processor and the UI take them for text, as a JSON export does.
    const std::string s = valid_utf8(raw);
    auto [it, fresh] = strings_.emplace(s, strings_.size() + 1);
    if (fresh) {
      Builder<pf::InternedString> m{packet_, pf::ProfilePacket::kStrings};
      m.add_uint64(pf::InternedString::kIid, it->second);
      m.add_bytes(pf::InternedString::kStr, s);
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
    Builder<pf::Mapping> m{packet_, pf::ProfilePacket::kMappings};
    m.add_uint64(pf::Mapping::kIid, id);
    m.add_uint64(pf::Mapping::kBuildId, build_id);
    m.add_uint64(pf::Mapping::kStart, 0);
    m.add_uint64(pf::Mapping::kEnd, 0);
    for (uint64_t p : parts) m.add_uint64(pf::Mapping::kPathStringIds, p);
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
    // The strings and the mapping first: their entries go into the packet before this frame's.
    const uint64_t name_id = string(name);
    const uint64_t mapping_id = mapping(module);
    Builder<pf::Frame> m{packet_, pf::ProfilePacket::kFrames};
    m.add_uint64(pf::Frame::kIid, id);
    m.add_uint64(pf::Frame::kFunctionNameId, name_id);
    m.add_uint64(pf::Frame::kMappingId, mapping_id);
    m.add_uint64(pf::Frame::kRelPc, f.python ? ++python_pcs_ : f.module_offset);
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
      Builder<pf::Callstack> m{packet_, pf::ProfilePacket::kCallstacks};
      m.add_uint64(pf::Callstack::kIid, it->second);
      for (uint64_t id : ids) m.add_uint64(pf::Callstack::kFrameIds, id);
    }
    return it->second;
  }
  // The ProfilePacket fields written so far (the tables).
  const std::string& tables() const { return tables_; }

 private:
  std::map<std::string, uint64_t> strings_, mappings_, frames_;
  std::map<std::vector<uint64_t>, uint64_t> callstacks_;
  uint64_t python_pcs_ = 0;
  std::string tables_;
  Builder<pf::ProfilePacket> packet_{tables_};
};

// The trace: TracePackets written in place, each with its timestamp first and the sequence last.
class Writer {
 public:
  explicit Writer(uint64_t t0_ns) : t0_ns_(t0_ns) {
    packet(t0_ns, [&](Builder<pf::TracePacket>& p) {
      Builder<pf::ClockSnapshot> snap{p, pf::TracePacket::kClockSnapshot};
      for (uint32_t id : {pf::kBoottime, pf::kMonotonic, pf::kMonotonicCoarse}) {
        Builder<pf::Clock> c{snap, pf::ClockSnapshot::kClocks};
        c.add_uint32(pf::Clock::kClockId, id);
        c.add_uint64(pf::Clock::kTimestamp, t0_ns);
      }
    }, /*first=*/true);
  }
  // One TracePacket at `t_ns`; `fill` writes its payload field.
  template <typename Fill>
  void packet(uint64_t t_ns, const Fill& fill, bool first = false) {
    Builder<pf::TracePacket> p{trace_, pf::Trace::kPacket};
    p.add_uint64(pf::TracePacket::kTimestamp, t_ns);
    fill(p);
    p.add_uint32(pf::TracePacket::kTrustedPacketSequenceId, kSequence);
    if (first) p.add_uint32(pf::TracePacket::kSequenceFlags, pf::kSeqIncrementalStateCleared);
  }
  // A track; `extra` writes a field of the descriptor after its uuid, parent and name.
  template <typename Extra>
  void track(uint64_t uuid, uint64_t parent, const std::string& name, const Extra& extra) {
    packet(t0_ns_, [&](Builder<pf::TracePacket>& p) {
      Builder<pf::TrackDescriptor> d{p, pf::TracePacket::kTrackDescriptor};
      d.add_uint64(pf::TrackDescriptor::kUuid, uuid);
      if (parent) d.add_uint64(pf::TrackDescriptor::kParentUuid, parent);
      if (!name.empty()) d.add_bytes(pf::TrackDescriptor::kName, valid_utf8(name));
      extra(d);
    });
  }
  void counter(uint64_t uuid, uint64_t t_ns, uint64_t value) {
    packet(t_ns, [&](Builder<pf::TracePacket>& p) {
      Builder<pf::TrackEvent> e{p, pf::TracePacket::kTrackEvent};
      e.add_enum(pf::TrackEvent::kType, pf::kTypeCounter);
      e.add_uint64(pf::TrackEvent::kTrackUuid, uuid);
      e.add_int64(pf::TrackEvent::kCounterValue, static_cast<int64_t>(value));
    });
  }
  void instant(uint64_t uuid, uint64_t t_ns, const std::string& name) {
    packet(t_ns, [&](Builder<pf::TracePacket>& p) {
      Builder<pf::TrackEvent> e{p, pf::TracePacket::kTrackEvent};
      e.add_enum(pf::TrackEvent::kType, pf::kTypeInstant);
      e.add_uint64(pf::TrackEvent::kTrackUuid, uuid);
      e.add_bytes(pf::TrackEvent::kName, valid_utf8(name));
    });
  }
  std::string take() { return std::move(out_); }

 private:
  uint64_t t0_ns_;
  std::string out_;
  Builder<pf::Trace> trace_{out_};
};

constexpr uint64_t kProcessTrack = 1;
uint64_t counter_track(int device, int figure) { return 0x1000 + static_cast<uint64_t>(device) * 8 + static_cast<uint64_t>(figure); }
constexpr uint64_t kMarksTrack = 2;

void describe_process(Writer& w, const ReportData& m, uint64_t t0_ns, const std::vector<int>& devices,
                      const std::map<int, uint64_t>& limits) {
  w.packet(t0_ns, [&](Builder<pf::TracePacket>& p) {
    Builder<pf::ProcessTree> tree{p, pf::TracePacket::kProcessTree};
    Builder<pf::Process> proc{tree, pf::ProcessTree::kProcesses};
    proc.add_int32(pf::Process::kPid, m.pid);
    proc.add_int32(pf::Process::kPpid, 0);
    // A string field, which protobuf requires to be UTF-8; a path need not be.
    proc.add_bytes(pf::Process::kCmdline, valid_utf8(m.exe));
  });
  w.track(kProcessTrack, 0, "", [&](Builder<pf::TrackDescriptor>& d) {
    Builder<pf::ProcessDescriptor> pd{d, pf::TrackDescriptor::kProcess};
    pd.add_int32(pf::ProcessDescriptor::kPid, m.pid);
    pd.add_bytes(pf::ProcessDescriptor::kProcessName, valid_utf8(file_name_of(m.exe) + " (gpushim)"));
  });
  auto bytes_unit = [](Builder<pf::TrackDescriptor>& d) {
    Builder<pf::CounterDescriptor> c{d, pf::TrackDescriptor::kCounter};
    c.add_enum(pf::CounterDescriptor::kUnit, pf::kUnitSizeBytes);
  };
  static const char* kFigures[] = {"allocated", "reserved", "cap"};
  for (int d : devices)
    for (int f = 0; f < 3; ++f)
      if (f < 2 || limits.count(d))
        w.track(counter_track(d, f), kProcessTrack, "device " + std::to_string(d) + " " + kFigures[f], bytes_unit);
  w.track(kMarksTrack, kProcessTrack, "gpushim events", [](Builder<pf::TrackDescriptor>&) {});
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


std::string heap_dump(int pid, int device, uint64_t t_ns, const std::map<uint64_t, Totals>& by_callstack) {
  std::string out;
  Builder<pf::ProcessHeapSamples> dump{out};
  dump.add_int32(pf::ProcessHeapSamples::kPid, pid);
  dump.add_uint64(pf::ProcessHeapSamples::kTimestamp, t_ns);
  dump.add_bytes(pf::ProcessHeapSamples::kHeapName, "cuda device " + std::to_string(device));
  for (const auto& [cs, t] : by_callstack) {
    Builder<pf::HeapSample> s{dump, pf::ProcessHeapSamples::kSamples};
    s.add_uint64(pf::HeapSample::kCallstackId, cs);
    s.add_uint64(pf::HeapSample::kSelfAllocated, t.allocated);
    s.add_uint64(pf::HeapSample::kSelfFreed, t.freed);
    s.add_uint64(pf::HeapSample::kTimestamp, t_ns);
    s.add_uint64(pf::HeapSample::kAllocCount, t.allocs);
    s.add_uint64(pf::HeapSample::kFreeCount, t.frees);
  }
  return out;
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
void add_profile_packet(Writer& w, const Interner& in, size_t i, size_t n, uint64_t t_ns, const std::string& dump) {
  w.packet(t_ns, [&](Builder<pf::TracePacket>& p) {
    std::string fields = i == 0 ? in.tables() : std::string();
    Builder<pf::ProfilePacket> packet{fields};
    packet.add_message(pf::ProfilePacket::kProcessDumps, dump);
    packet.add_bool(pf::ProfilePacket::kContinued, i + 1 < n);
    packet.add_uint64(pf::ProfilePacket::kIndex, i);
    p.add_message(pf::TracePacket::kProfilePacket, fields);
  });
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
  std::vector<std::pair<uint64_t, std::string>> dumps;  // (time, dump)
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
