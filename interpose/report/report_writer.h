// Renders a ReportData: JSON to a file, and the short human summary to stderr.
#pragma once

#include <cstdio>
#include <string>

#include "report/report_model.h"

namespace gpushim {

// Serializes `report` as one JSON document (schema in docs/report-format.md).
std::string report_to_json(const ReportData& report);

// Writes the human summary: peaks and totals per device, then the top `max_sites` live sites with
// their stacks, then the JSON path. Writes to `out` (stderr in the shim).
void write_summary(const ReportData& report, const std::string& json_path, size_t max_sites, FILE* out);

}  // namespace gpushim
