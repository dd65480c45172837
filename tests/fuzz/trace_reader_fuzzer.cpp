// libFuzzer target: gpushim-analyze's trace reader on arbitrary bytes (corrupted, truncated or
// hostile binary traces: a crash, kill -9 or a full disk cuts a real trace anywhere).
//
// Every chunk carries a CRC, so almost every mutation of a real trace is refused at the checksum
// and never reaches the chunk decoders. Each input is therefore read twice: as given (the checksum
// path), and with the checksum of every chunk that can be delimited recomputed, so that the
// decoders see mutated payloads.
//
// Checked on every input (a violation traps, which libFuzzer reports as a crash): parse_trace
// either refuses the input with one clear line (not a trace at all) or reads it up to the damage,
// and then what it read is consistent: all of the input is used unless the trace is marked
// truncated (with a reason), events are in time order, every free it kept frees a live
// allocation; the timeline and the analysis view (summary, sites, growth) build from it, with
// sites largest first and no device holding more blocks than it allocated.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "run_view.h"
#include "trace/trace_format.h"
#include "trace_reader.h"

namespace {

namespace analysis = gpushim::analysis;
namespace trace = gpushim::trace;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

uint32_t get_u32le(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Recomputes the CRC of every chunk whose header and payload are complete (the layout of
// trace_format.h: sync u32, type u8, 3 zero bytes, length u32, CRC u32 over the first 12 header
// bytes and the payload). Stops at the first place that is not a chunk.
std::string with_fixed_checksums(std::string bytes) {
  size_t pos = sizeof(trace::kFileMagic);
  while (pos <= bytes.size() && bytes.size() - pos >= trace::kChunkHeaderSize) {
    char* h = bytes.data() + pos;
    if (get_u32le(h) != trace::kChunkSync) break;
    const uint32_t length = get_u32le(h + 8);
    if (length > bytes.size() - pos - trace::kChunkHeaderSize) break;
    const uint32_t crc = trace::crc32(h + trace::kChunkHeaderSize, length, trace::crc32(h, 12));
    for (int i = 0; i < 4; ++i) h[12 + i] = static_cast<char>(crc >> (8 * i));
    pos += trace::kChunkHeaderSize + length;
  }
  return bytes;
}

void check(const std::string& bytes) {
  analysis::TraceData t;
  std::string error;
  if (!analysis::parse_trace(bytes, &t, &error)) {
    require(!error.empty() && error.size() < 1000 && error.find('\n') == std::string::npos);
    return;
  }
  require(analysis::looks_like_trace(bytes));
  require(analysis::looks_like_report_or_trace(bytes.data(), bytes.size()));  // read_file's early refusal
  require(t.bytes_used <= bytes.size());
  require(t.truncated ? !t.stop_reason.empty() : t.bytes_used == bytes.size());
  absl::flat_hash_set<uint64_t> live;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const analysis::TraceEvent& e = t.events[i];
    require(static_cast<uint8_t>(e.kind) < trace::kEventKindCount);
    if (e.kind == trace::EventKind::kReuse) require(e.requested < trace::kReuseMomentCount);
    if (i > 0) require(t.events[i - 1].t_ns <= e.t_ns);
    if (e.kind == trace::EventKind::kAlloc) live.insert(e.addr);
    if (e.kind == trace::EventKind::kFree) require(live.erase(e.addr) == 1);
  }
  const auto timeline = analysis::trace_timeline(t, 64);
  for (size_t i = 1; i < timeline.size(); ++i) require(timeline[i - 1].t_s <= timeline[i].t_s);

  // The view symbolizes stacks through the recorded modules' files. Paths from fuzzed bytes must
  // not make the fuzzer open files, so modules keep their ranges but lose the leading '/' (the
  // symbolizer opens absolute paths only, and treats the rest like the vdso).
  for (auto& [id, m] : t.modules)
    if (!m.path.empty() && m.path[0] == '/') m.path[0] = '_';
  analysis::RunView view;
  analysis::run_from_trace(t, "fuzz.trace", &view);
  for (size_t i = 1; i < view.sites.size(); ++i) require(view.sites[i - 1].live_bytes >= view.sites[i].live_bytes);
  for (const auto& d : view.meta.devices) {
    require(d.live_count <= d.total_allocs);
    require(d.live_bytes <= d.peak_bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  check(bytes);
  if (analysis::looks_like_trace(bytes)) check(with_fixed_checksums(bytes));
  return 0;
}
