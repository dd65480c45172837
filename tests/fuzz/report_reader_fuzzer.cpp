// libFuzzer target: gpushim-analyze's report reader on arbitrary bytes (corrupted, truncated or
// hostile JSON reports).
//
// Checked on every input (a violation traps, which libFuzzer reports as a crash): parse_report
// either succeeds, and the analysis view builds from what it read, or fails with one clear line
// (non-empty, no newline, bounded) that the user sees as gpushim-analyze's error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "report_reader.h"
#include "run_view.h"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  gpushim::analysis::ReportFile report;
  std::string error;
  if (!gpushim::analysis::parse_report(bytes, &report, &error)) {
    require(!error.empty() && error.size() < 1000 && error.find('\n') == std::string::npos);
    return 0;
  }
  gpushim::analysis::RunView view;
  require(gpushim::analysis::run_from_report(report, "fuzz.json", &view));
  for (size_t i = 1; i < view.sites.size(); ++i) require(view.sites[i - 1].live_bytes >= view.sites[i].live_bytes);
  return 0;
}
