// libFuzzer target: gpushim-analyze's report reader on arbitrary bytes (corrupted, truncated or
// hostile JSON reports).
//
// Checked on every input (a violation traps, which libFuzzer reports as a crash):
//   - parse_report either fails with one clear line (non-empty, no newline, bounded), which the
//     user sees as gpushim-analyze's error, or succeeds;
//   - what it read, written back by the shim's own report writer, reads again, and from the second
//     writing on, reading and writing again gives the same bytes: reader and writer agree on every
//     value the reader accepts (numbers at the edges of their types, non-finite doubles, escapes);
//   - the analysis view builds from it, with sites largest first;
//   - gpushim-analyze's bounded reading (read_file refuses at once what cannot begin a report or
//     a trace) accepts it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "report/report_writer.h"
#include "report_reader.h"
#include "run_view.h"

namespace {

namespace analysis = gpushim::analysis;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  analysis::ReportFile report;
  std::string error;
  if (!analysis::parse_report(bytes, &report, &error)) {
    require(!error.empty() && error.size() < 1000 && error.find('\n') == std::string::npos);
    return 0;
  }
  // read_file's early refusal (`summary /dev/zero`) never turns away a report the reader accepts.
  require(analysis::looks_like_report_or_trace(bytes.data(), bytes.size()));
  // Written once, strings are valid UTF-8 (the writer replaces invalid bytes with \ufffd, which
  // reads back as the character itself): from then on, reading and writing is a fixed point.
  const std::string written = gpushim::report_to_json(report.report);
  analysis::ReportFile again;
  require(analysis::parse_report(written, &again, &error));
  const std::string rewritten = gpushim::report_to_json(again.report);
  analysis::ReportFile third;
  require(analysis::parse_report(rewritten, &third, &error));
  require(gpushim::report_to_json(third.report) == rewritten);

  analysis::RunView view;
  require(analysis::run_from_report(report, "fuzz.json", &view));
  for (size_t i = 1; i < view.sites.size(); ++i) require(view.sites[i - 1].live_bytes >= view.sites[i].live_bytes);
  return 0;
}
