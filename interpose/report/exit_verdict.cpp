#include "report/exit_verdict.h"

#include "util/text.h"
#include "util/units.h"

namespace gpushim {

std::string exit_verdict(const ReportData& r, uint64_t leak_bytes) {
  std::string why;
  auto add = [&](const std::string& reason) { why += (why.empty() ? "" : "; ") + reason; };
  if (!r.growth.suspects.empty()) add(plural(r.growth.suspects.size(), "growth suspect"));
  if (r.invalid_frees != 0) add(plural(r.invalid_frees, "invalid free"));
  if (leak_bytes != UINT64_MAX) {
    uint64_t live = 0;
    for (const DeviceReport& d : r.devices) live += d.live_bytes;
    if (live > leak_bytes)
      add(format_bytes(live) + " of device memory live at exit, above GPUSHIM_EXIT_LEAK_BYTES=" + format_bytes(leak_bytes));
  }
  return why;
}

}  // namespace gpushim
