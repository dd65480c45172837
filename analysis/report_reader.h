// Reads a gpushim JSON report (docs/report-format.md) back into the report model the shim wrote it
// from. Reports written on exit and on-demand snapshots ("reason": "snapshot") read the same way.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "report/report_model.h"

namespace gpushim::analysis {

// A growth suspect as a report lists it (a "growth" section, when the shim that wrote the report
// tracks growth). Read generically: the frames and every numeric field by name.
struct GrowthEntry {
  int device = 0;
  std::vector<FrameInfo> frames;
  std::map<std::string, double> figures;  // e.g. bytes_per_s, bytes_per_iteration, live_bytes
};

struct ReportFile {
  ReportData report;
  bool has_growth = false;  // the report has a growth section (even an empty one)
  std::string growth_verdict, growth_evidence;  // "" from shims that wrote no verdict
  uint64_t growth_steps_per_pattern = 0;  // GrowthReport::steps_per_pattern (0 from shims that wrote none)
  // gpushim_mark_iteration() calls: the growth section's iterations when marks alone were counted
  // (iteration_source "marks"; "none": 0); unknown when a site's or detected steps count too.
  std::optional<uint64_t> iteration_marks;
  std::vector<GrowthEntry> growth;
};

// Never crashes or throws on bad input: returns false with a one-line message naming the field
// (e.g. "devices[1].live_bytes: expected an unsigned integer").
bool parse_report(const std::string& bytes, ReportFile* out, std::string* error);

}  // namespace gpushim::analysis
