// One run as the analysis commands see it, whether it comes from a report (the state at exit or
// at a snapshot) or from a trace (every event, so also peaks per site and growth over time).
// summary, diff, merge and the folded export all work on this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report/report_model.h"
#include "report_reader.h"
#include "trace_reader.h"

namespace gpushim::analysis {

struct SiteView {
  int device = 0;
  std::string kind = "device";
  uint64_t live_bytes = 0;  // at the end of the run (exit, snapshot, or the trace's last event)
  uint64_t live_count = 0;
  // Traces only (has_history): the site's own highest live bytes, and its bytes at the moment its
  // device reached peak allocated (what to cut to lower the peak).
  bool has_history = false;
  uint64_t peak_bytes = 0;
  uint64_t at_device_peak_bytes = 0;
  uint64_t total_allocs = 0;
  std::vector<FrameInfo> frames;  // innermost first
};

struct GrowthSuspect {
  int device = 0;
  std::vector<FrameInfo> frames;
  uint64_t grew_bytes = 0;        // from first to last checkpoint
  double bytes_per_s = 0;
  double bytes_per_iteration = 0;  // 0 without iteration marks
  uint64_t live_bytes = 0, live_count = 0;
  int checkpoints = 0;             // samples the verdict rests on
};

struct RunView {
  std::string path;
  std::string source;  // "report" or "trace"
  ReportData meta;     // pid, exe, host, rank, policy, reason, duration, devices, other_memory, ooms, timeline
  std::vector<SiteView> sites;  // largest live_bytes first
  std::vector<GrowthSuspect> growth;  // strongest first
  bool growth_known = false;          // false: the source carries no growth information
  std::string growth_not_judged;      // why growth was not judged ("3 iterations seen, 8 needed"); "" if it was
  std::string growth_verdict;         // "suspects", "none" or "not judged"; "" when growth is unknown
  std::string growth_evidence;        // how much evidence the verdict rests on ("20 iterations seen, 8 needed")
  std::string growth_unit = "iteration";  // what GrowthSuspect::bytes_per_iteration is per (growth_unit())
  std::vector<double> iterations_s;   // iteration marks (traces)
  std::optional<uint64_t> iteration_marks;  // how many (a report knows the count, when it knows it)
  std::vector<std::string> notes;     // incompleteness worth telling the user about
  const DeviceReport* device(int ordinal) const;
};

// Loads a report or a trace (told apart by content, not by name). Traces are symbolized offline.
// A caller that needs the trace's events too gets them in `trace` (left empty for a report): the
// input is read once, as a pipe or process substitution can be read only once.
bool load_run(const std::string& path, RunView* out, std::string* error, std::optional<TraceData>* trace = nullptr);
bool run_from_report(const ReportFile& report, const std::string& path, RunView* out);
void run_from_trace(const TraceData& trace, const std::string& path, RunView* out);

// The head of every JSON document gpushim-analyze writes about one run, the run's identity with
// its fields always in this order: {"source", "path", "pid", "exe", "rank", "policy", "reason",
// "duration_s" (exact, %.17g). Appends it to `j` without the closing brace.
void append_run_header_json(std::string* j, const RunView& run);

// Allocated/reserved per device after every event of a trace, oldest first; with max_points
// non-zero, thinned per device to about that many points, keeping each stretch's highest value.
std::vector<TimelineSample> trace_timeline(const TraceData& trace, size_t max_points_per_device);

// Reads a whole report or trace; false with a one-line message on error. Untrusted input gets
// bounded resources: what does not begin like a report (JSON) or a trace (its magic) is refused
// after its first block (`summary /dev/zero` ends at once), and no input larger than
// input_limit_bytes() is read (a pipe or device is cut off there).
// `torn`: where given, gzip data cut short is read up to the tear (a trace's torn tail is then read
// as any other, docs/trace-format.md) and *torn says so; otherwise it is an error.
bool read_file(const std::string& path, std::string* out, std::string* error, std::string* torn = nullptr);

// GPUSHIM_ANALYZE_MAX_INPUT when set (bytes with units), else an eighth of the machine's memory
// (the parsed form takes about four times the file's size), at least 64 MiB.
uint64_t input_limit_bytes();
// The most events a trace is read for (parse_trace's `max_events`): their vector takes what
// input_limit_bytes() allows a file, since a trace's events take ten to forty times its bytes in
// memory (a 100 MB trace of small events once took 3.7 GB).
uint64_t trace_event_limit();
// A trace file's bytes as every command reads them: parse_trace up to trace_event_limit(), and a
// trace with nothing to read (neither events nor an end record: TraceData::nothing_to_read)
// refused. `error` is one line, without the file's name.
bool parse_trace_to_read(const std::string& bytes, TraceData* out, std::string* error);
// Whether `head`, the start of an input, can begin a report or a trace: the trace magic, or a JSON
// object opening with a key and no control byte but whitespace. scripts/gpushim-plot applies the
// same rule to reports before reading them whole.
bool looks_like_report_or_trace(const char* head, size_t n);

// A stable identity for a site across runs: device, kind and the symbolized frames (function,
// file, line, module name), never raw addresses, which change with ASLR.
std::string site_identity(const SiteView& s);

// "12.0 MiB"-style bytes (diff's signed changes: cmd_diff.cpp's change()).
std::string human_bytes(uint64_t b);

}  // namespace gpushim::analysis
