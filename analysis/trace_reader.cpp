#include "trace_reader.h"

#include <algorithm>
#include <cstring>

#include <zlib.h>

namespace gpushim::analysis {

using trace::ByteReader;
using trace::ChunkType;

namespace {

constexpr uint64_t kMaxStackDepth = 4096;

bool decode_header(ByteReader& r, TraceData* t, std::string* error) {
  uint64_t major = 0, minor = 0, pid = 0, depth = 0, n = 0;
  if (!r.varint(&major) || !r.varint(&minor)) return *error = "malformed trace header", false;
  if (major != trace::kVersionMajor) {
    *error = "unsupported trace format version " + std::to_string(major) + "." + std::to_string(minor) +
             " (this tool reads version " + std::to_string(trace::kVersionMajor) + ".x)";
    return false;
  }
  t->version_minor = static_cast<uint32_t>(minor);
  trace::HeaderInfo& h = t->header;
  if (!r.varint(&pid) || !r.string(&h.exe) || !r.string(&h.host) || !r.string(&h.rank) || !r.string(&h.policy) ||
      !r.varint(&h.start_mono_ns) || !r.varint(&h.start_wall_ns) || !r.varint(&depth) || !r.varint(&n) ||
      n > 100000)
    return *error = "malformed trace header", false;
  h.pid = static_cast<int>(pid);
  h.stack_depth = static_cast<uint32_t>(depth);
  for (uint64_t i = 0; i < n; ++i) {
    std::string c;
    if (!r.string(&c)) return *error = "malformed trace header", false;
    h.config.push_back(std::move(c));
  }
  return true;
}

bool decode_device(ByteReader& r, TraceData* t) {
  uint64_t ord = 0;
  trace::DeviceInfo d;
  if (!r.varint(&ord) || !r.varint(&d.capacity) || !r.varint(&d.limit)) return false;
  d.ordinal = static_cast<int>(trace::unzigzag(ord));
  t->devices.push_back(d);
  return true;
}

bool decode_modules(ByteReader& r, TraceData* t) {
  uint64_t n = 0;
  if (!r.varint(&n) || n > r.left()) return false;
  for (uint64_t i = 0; i < n; ++i) {
    trace::ModuleInfo m;
    uint64_t id = 0, size = 0;
    if (!r.varint(&id) || id > UINT32_MAX || !r.string(&m.path) || !r.varint(&m.bias) || !r.varint(&m.begin) ||
        !r.varint(&size) || !r.string(&m.build_id, 256))
      return false;
    m.id = static_cast<uint32_t>(id);
    m.end = m.begin + size;
    t->modules[m.id] = std::move(m);
  }
  return true;
}

bool decode_stacks(ByteReader& r, TraceData* t) {
  uint64_t n = 0;
  if (!r.varint(&n) || n > r.left()) return false;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t id = 0, depth = 0;
    if (!r.varint(&id) || id > UINT32_MAX || !r.varint(&depth) || depth > kMaxStackDepth || depth > r.left())
      return false;
    std::vector<trace::FrameCode> frames(depth);
    for (auto& f : frames)
      if (!r.varint(&f.selector) || !r.varint(&f.value)) return false;
    t->stacks[static_cast<uint32_t>(id)] = std::move(frames);
  }
  return true;
}

bool decode_pyframes(ByteReader& r, TraceData* t) {
  uint64_t n = 0;
  if (!r.varint(&n) || n > r.left()) return false;
  for (uint64_t i = 0; i < n; ++i) {
    trace::PyFrameInfo f;
    uint64_t id = 0, line = 0;
    if (!r.varint(&id) || id > UINT32_MAX || !r.string(&f.function) || !r.string(&f.file) || !r.varint(&line))
      return false;
    f.id = static_cast<uint32_t>(id);
    f.line = static_cast<int>(std::min<uint64_t>(line, INT32_MAX));
    t->pyframes[f.id] = std::move(f);
  }
  return true;
}

bool decode_end(ByteReader& r, TraceData* t) {
  trace::EndInfo e;
  uint64_t n = 0;
  if (!r.varint(&e.end_mono_ns) || !r.varint(&e.events_written) || !r.varint(&e.events_dropped) || !r.varint(&n) ||
      n > r.left())
    return false;
  for (uint64_t i = 0; i < n; ++i) {
    trace::DeviceTotals d;
    uint64_t ord = 0;
    if (!r.varint(&ord) || !r.varint(&d.live_bytes) || !r.varint(&d.live_count) || !r.varint(&d.peak_bytes) ||
        !r.varint(&d.peak_reserved) || !r.varint(&d.total_allocs) || !r.varint(&d.total_frees) ||
        !r.varint(&d.failed_allocs) || !r.varint(&d.ooms))
      return false;
    d.ordinal = static_cast<int>(trace::unzigzag(ord));
    e.devices.push_back(d);
  }
  // The pool's retries, one per device, from shims that write them (older ones end here).
  std::vector<uint64_t> retries(e.devices.size());
  bool has_retries = !e.devices.empty() && r.left() > 0;
  for (uint64_t& v : retries) has_retries = has_retries && r.varint(&v);
  if (has_retries)
    for (size_t i = 0; i < retries.size(); ++i) e.devices[i].alloc_retries = retries[i];
  // Then reserved at the end, one per device (format 1.4; earlier ones end before it).
  std::vector<uint64_t> reserved(e.devices.size());
  bool has_reserved = has_retries && r.left() > 0;
  for (uint64_t& v : reserved) has_reserved = has_reserved && r.varint(&v);
  if (has_reserved)
    for (size_t i = 0; i < reserved.size(); ++i) e.devices[i].reserved = reserved[i];
  // Then when the interpreter's teardown began (format 1.5), after the per-device lists, which a
  // run with no device leaves empty: told by the version, not by what is left.
  if (t->version_minor >= 5 && !r.varint(&e.teardown_mono_ns)) return false;
  t->end = std::move(e);
  return true;
}

// The inverse of trace::EventEncoder.
bool decode_events(ByteReader& r, std::vector<TraceEvent>* out) {
  uint64_t base = 0, count = 0;
  if (!r.varint(&base) || !r.varint(&count) || count > r.left()) return false;
  uint64_t t = base, addr = 0, stream = 0;
  uint32_t stack = 0;
  int16_t device = 0;
  uint8_t flags = 0;
  std::vector<std::pair<int16_t, uint64_t>> seqs;
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t tag = 0;
    uint64_t v = 0;
    if (!r.u8(&tag) || !r.varint(&v)) return false;
    const uint8_t kind = tag & trace::kTagKindMask;
    if (kind >= trace::kEventKindCount) return false;
    t += static_cast<uint64_t>(trace::unzigzag(v));
    if (tag & trace::kTagStream) {
      if (!r.varint(&stream)) return false;
    }
    if (tag & trace::kTagDevice) {
      if (!r.varint(&v)) return false;
      const int64_t d = trace::unzigzag(v);
      if (d < INT16_MIN || d > INT16_MAX) return false;
      device = static_cast<int16_t>(d);
    }
    if ((tag & trace::kTagFlags) && !r.u8(&flags)) return false;
    if (tag & trace::kTagStack) {
      if (!r.varint(&v) || v > UINT32_MAX) return false;
      stack = static_cast<uint32_t>(v);
    }
    TraceEvent e;
    e.t_ns = t;
    e.kind = static_cast<EventKind>(kind);
    e.stream = stream;
    e.device = device;
    e.flags = flags;
    auto read_addr = [&] {
      if (!r.varint(&v)) return false;
      addr += static_cast<uint64_t>(trace::unzigzag(v));
      e.addr = addr;
      return true;
    };
    switch (e.kind) {
      case EventKind::kAlloc:
        if (!read_addr() || !r.varint(&e.requested) || !r.varint(&v)) return false;
        e.size = e.requested + static_cast<uint64_t>(trace::unzigzag(v));
        e.stack = stack;
        break;
      case EventKind::kFree:
        if (!read_addr()) return false;
        break;
      case EventKind::kSegmentAlloc:
      case EventKind::kSegmentFree:
      case EventKind::kSegmentMap:
      case EventKind::kSegmentUnmap:
      case EventKind::kVaReserve:
      case EventKind::kVaFree:
        if (!read_addr() || !r.varint(&e.size)) return false;
        break;
      case EventKind::kOom:
        if (!r.varint(&e.requested) || !r.varint(&e.size)) return false;
        e.stack = stack;
        break;
      case EventKind::kIteration:
      case EventKind::kDropped:
        if (!r.varint(&e.size)) return false;
        break;
      case EventKind::kReuse:
        if (!r.varint(&e.requested) || e.requested >= trace::kReuseMomentCount || !r.varint(&e.size) ||
            !r.varint(&e.addr))
          return false;
        break;
      case EventKind::kCheckpoint:
        if (!r.varint(&e.size) || !r.varint(&e.requested)) return false;
        break;
      case EventKind::kStreamRetired:
        if (!r.varint(&e.size)) return false;
        break;
    }
    if (flags & trace::kFlagSequenced) {
      if (!r.varint(&v)) return false;
      // Peek the device's previous number, then store this one.
      const uint64_t prev = trace::exchange_seq(&seqs, device, 0);
      e.seq = prev + static_cast<uint64_t>(trace::unzigzag(v));
      trace::exchange_seq(&seqs, device, e.seq);
    }
    out->push_back(e);
  }
  return r.done();
}

// A device's pool events carry their number in the pool's order; timestamps of concurrent
// operations, taken outside the pool's lock, may be inverted. Keep the places that the time order
// gives a device's sequenced events, and fill them in sequence order; then keep times monotone.
void order_pool_events(std::vector<TraceEvent>* events) {
  std::map<int16_t, std::vector<size_t>> places;
  for (size_t i = 0; i < events->size(); ++i)
    if ((*events)[i].flags & trace::kFlagSequenced) places[(*events)[i].device].push_back(i);
  bool moved = false;
  for (auto& [device, idx] : places) {
    std::vector<TraceEvent> ordered;
    ordered.reserve(idx.size());
    for (size_t i : idx) ordered.push_back((*events)[i]);
    if (std::is_sorted(ordered.begin(), ordered.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; }))
      continue;
    std::stable_sort(ordered.begin(), ordered.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; });
    for (size_t k = 0; k < idx.size(); ++k) (*events)[idx[k]] = ordered[k];
    moved = true;
  }
  if (!moved) return;
  for (size_t i = 1; i < events->size(); ++i) (*events)[i].t_ns = std::max((*events)[i].t_ns, (*events)[i - 1].t_ns);
}

// Completes frees with what their allocation said, and drops frees that match nothing.
void join_frees(TraceData* t) {
  absl::flat_hash_map<uint64_t, TraceEvent> live;  // each live allocation's event, by address
  std::vector<TraceEvent> kept;
  kept.reserve(t->events.size());
  for (TraceEvent& e : t->events) {
    if (e.kind == EventKind::kAlloc) {
      auto [it, fresh] = live.try_emplace(e.addr, e);
      if (!fresh) {
        // The address was handed out again while the trace still holds it: its free was among
        // the dropped events. It ended by now, so it ends here, or every later reading of the
        // trace would count it live on top of its successor (a churning program's trace once
        // summed to a 1.1 GiB "leak" where the run held nothing).
        TraceEvent ended = it->second;
        ended.kind = EventKind::kFree;
        ended.t_ns = e.t_ns;
        ended.seq = e.seq;
        kept.push_back(ended);
        it->second = e;
        ++t->implied_frees;
      }
    } else if (e.kind == EventKind::kFree) {
      auto it = live.find(e.addr);
      if (it == live.end()) {
        ++t->unmatched_frees;
        continue;
      }
      e.size = it->second.size;
      e.requested = it->second.requested;
      e.stack = it->second.stack;
      live.erase(it);
    }
    kept.push_back(e);
  }
  t->events.swap(kept);
}

}  // namespace

std::string TraceData::stop_note() const {
  if (version_minor > trace::kVersionMinor && stop_reason.rfind("malformed chunk", 0) == 0)
    return "the trace is format 1." + std::to_string(version_minor) + ", newer than this tool reads (1." +
           std::to_string(trace::kVersionMinor) + "), and stops at the first chunk it cannot read (" + stop_reason +
           "; a newer gpushim-analyze reads on)";
  return "the trace is cut short (" + stop_reason + ")";
}

std::string TraceData::nothing_to_read() const {
  if (!events.empty() || !checkpoints.empty() || end) return "";
  if (truncated) return "no events to read: " + stop_note();
  return "no events to read: the trace ends after its header (at byte " + std::to_string(bytes_used) +
         "), without an end record: the recording stopped before the shim wrote any events";
}

const trace::DeviceInfo* TraceData::device(int ordinal) const {
  for (const auto& d : devices)
    if (d.ordinal == ordinal) return &d;
  return nullptr;
}

bool chunk_crc_ok(const uint8_t* header, const uint8_t* payload, uint32_t length, uint32_t crc) {
  uLong c = ::crc32(0L, header, trace::kChunkCrcCovered);
  c = ::crc32(c, payload, length);
  return c == crc;
}

bool looks_like_trace(const std::string& bytes) {
  return bytes.size() >= sizeof(trace::kFileMagic) &&
         std::memcmp(bytes.data(), trace::kFileMagic, sizeof(trace::kFileMagic)) == 0;
}

bool parse_trace(const std::string& bytes, TraceData* out, std::string* error, uint64_t max_events) {
  std::string ignored;
  if (!error) error = &ignored;
  if (!looks_like_trace(bytes)) {
    *error = "not a gpushim trace (no GPUSHIMT magic)";
    return false;
  }
  TraceData t;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t pos = sizeof(trace::kFileMagic);
  bool have_header = false;
  uint64_t marker_drops = 0;
  auto stop = [&](const std::string& why) {
    t.truncated = true;
    t.stop_reason = why + " at byte " + std::to_string(pos);
  };
  while (pos < bytes.size()) {
    if (bytes.size() - pos < trace::kChunkHeaderSize) {
      stop("torn chunk header");
      break;
    }
    trace::ChunkHeader ch;
    if (!trace::parse_chunk_header(data + pos, &ch)) {
      stop("bad chunk header");
      break;
    }
    if (bytes.size() - pos - trace::kChunkHeaderSize < ch.length) {
      stop("torn chunk (" + std::to_string(ch.length) + " bytes announced)");
      break;
    }
    const uint8_t* payload = data + pos + trace::kChunkHeaderSize;
    if (!chunk_crc_ok(data + pos, payload, ch.length, ch.crc)) {
      stop("checksum mismatch");
      break;
    }
    ByteReader r(payload, ch.length);
    if (!have_header) {
      if (ch.type != ChunkType::kHeader) {
        *error = "not a gpushim trace: the first chunk is not a header";
        return false;
      }
      if (!decode_header(r, &t, error)) return false;
      have_header = true;
    } else {
      if (ch.type == ChunkType::kEvents && t.events.size() >= max_events) {
        stop("events past the first " + std::to_string(t.events.size()) +
             " left unread: their memory would pass the input budget (an eighth of the machine's memory, or "
             "GPUSHIM_ANALYZE_MAX_INPUT)");
        break;
      }
      bool ok = true;
      const size_t before = t.events.size();
      switch (ch.type) {
        case ChunkType::kHeader: ok = false; break;  // only one
        case ChunkType::kDevice: ok = decode_device(r, &t); break;
        case ChunkType::kModules: ok = decode_modules(r, &t); break;
        case ChunkType::kStacks: ok = decode_stacks(r, &t); break;
        case ChunkType::kPyFrames: ok = decode_pyframes(r, &t); break;
        case ChunkType::kEnd: ok = decode_end(r, &t); break;
        case ChunkType::kEvents:
          ok = decode_events(r, &t.events);
          if (!ok) t.events.resize(before);  // all of a chunk or none of it
          break;
        default: break;  // a newer writer's chunk type: skip it
      }
      if (!ok) {
        stop("malformed chunk of type " + std::to_string(static_cast<int>(ch.type)));
        break;
      }
    }
    pos += trace::kChunkHeaderSize + ch.length;
    t.bytes_used = pos;
  }
  if (!have_header) {
    // The magic is there: a trace cut short before its header ended, not another kind of file.
    *error = t.truncated ? "a gpushim trace cut short inside its header chunk (" + t.stop_reason + "): nothing to read"
                         : "a gpushim trace cut short after its first " + std::to_string(bytes.size()) +
                               " bytes, before its header chunk: nothing to read";
    return false;
  }
  // Chunks from different threads' rings may overlap in time; order them (stable: a thread's own
  // events keep their order even at equal times).
  std::stable_sort(t.events.begin(), t.events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.t_ns < b.t_ns; });
  order_pool_events(&t.events);
  for (const TraceEvent& e : t.events)
    if (e.kind == EventKind::kDropped) marker_drops += e.size;
  t.dropped = t.end ? std::max(t.end->events_dropped, marker_drops) : marker_drops;
  join_frees(&t);
  size_t kept = 0;
  for (const TraceEvent& e : t.events) {
    if (e.kind == EventKind::kCheckpoint) t.checkpoints.push_back({e.t_ns, kept, e.size, static_cast<unsigned>(e.requested)});
    else t.events[kept++] = e;
  }
  t.events.resize(kept);
  *out = std::move(t);
  return true;
}

}  // namespace gpushim::analysis
