// Reads a GPUSHIM_TRACE file (docs/trace-format.md) into memory. A trace cut short (crash, kill -9,
// full disk) reads up to its last complete chunk; a corrupt one up to the damage.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "trace/trace_encoder.h"
#include "trace/trace_event.h"

namespace gpushim::analysis {

using trace::EventKind;
using trace::TraceEvent;

// The site of an allocation or free event: the shim's own key (accounting/allocation_tracker.h),
// so that the offline tools group a trace's events as the report groups live allocations.
inline SiteKey site_key(const TraceEvent& e) {
  return SiteKey{e.stack, e.device, static_cast<MemoryKind>(e.flags & trace::kFlagKindMask)};
}

struct TraceData {
  trace::HeaderInfo header;
  uint32_t version_minor = 0;
  std::vector<trace::DeviceInfo> devices;
  std::map<uint32_t, trace::ModuleInfo> modules;
  absl::flat_hash_map<uint32_t, std::vector<trace::FrameCode>> stacks;
  std::map<uint32_t, trace::PyFrameInfo> pyframes;
  // Every event in time order. Frees carry the size, requested size and stack of the allocation
  // they free. Frees of addresses the trace never saw allocated (lost to drops, or allocated
  // before the trace began) are not in this list; see unmatched_frees.
  std::vector<TraceEvent> events;
  // The shim's growth checkpoints (kCheckpoint events), in time order, kept apart from `events`
  // so that event numbers count the program's events only.
  struct Checkpoint {
    uint64_t t_ns = 0;
    uint64_t events_before = 0;  // how many of `events` precede it
    uint64_t iterations = 0;     // counted so far
    unsigned sources = 0;        // IterationCounter::Source bits
  };
  std::vector<Checkpoint> checkpoints;
  std::optional<trace::EndInfo> end;  // absent if the process did not exit cleanly

  // Reading notes: how complete the trace is.
  bool truncated = false;   // stopped before the end of the file (torn or corrupt chunk)
  std::string stop_reason;  // why, with the byte offset
  uint64_t bytes_used = 0;  // bytes of the file that were read as complete chunks
  uint64_t dropped = 0;     // events the shim dropped (sum of kDropped markers, or the end chunk's total)
  uint64_t unmatched_frees = 0;
  // Allocations of an address the trace still held live: the earlier one's free was dropped, and
  // a free event ends it there (join_frees).
  uint64_t implied_frees = 0;

  const trace::DeviceInfo* device(int ordinal) const;
  // Why reading stopped early, for the notes: "the trace is cut short (...)", or, for a trace of a
  // newer minor version, that it holds what this tool cannot read (a newer shim's event kinds
  // make a chunk unreadable here: not damage, and the user's remedy is a newer gpushim-analyze).
  std::string stop_note() const;
  // Why the trace holds nothing to analyse, for a one-line refusal: no events and no end record
  // (cut short before its first events chunk, or a run stopped before the shim's writer wrote
  // one). "" when it holds either: a crashed run's trace has no end record but its events, and a
  // run that allocated nothing has an end record. Such a trace read as a run that allocated
  // nothing (empty tables, exit 0); summary, diff, merge, replay and export refuse it alike.
  std::string nothing_to_read() const;
  // Seconds since the shim started, for an event time.
  double seconds(uint64_t t_ns) const {
    return t_ns >= header.start_mono_ns ? static_cast<double>(t_ns - header.start_mono_ns) / 1e9 : 0.0;
  }
};

// Returns false with a one-line message only when `bytes` is not a trace at all (wrong magic,
// unsupported major version, missing header). Damage after the header is not an error: reading
// stops there and `truncated` says so. Never crashes on any input.
// `max_events`: reading stops there, as at damage (`truncated`, with the reason): a trace's events
// take ten to forty times its bytes in memory, which a file under the input size limit could
// otherwise spend past what the machine has (run_view.h: trace_event_limit()).
bool parse_trace(const std::string& bytes, TraceData* out, std::string* error,
                 uint64_t max_events = UINT64_MAX);

// True if `bytes` starts like a trace (for telling traces from reports).
bool looks_like_trace(const std::string& bytes);

// True if `crc` matches the chunk's header bytes (minus the CRC field) and its payload. Computed
// with zlib's crc32 (sliced, several times the writer's byte-at-a-time table on the large traces
// this reads), so every chunk the shim writes is also checked against a second implementation.
bool chunk_crc_ok(const uint8_t* header, const uint8_t* payload, uint32_t length, uint32_t crc);

}  // namespace gpushim::analysis
