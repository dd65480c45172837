// GPUSHIM_EXIT_CODE's checks on the exit report: what makes a run fail in CI.
#pragma once

#include <cstdint>
#include <string>

#include "report/report_model.h"

namespace gpushim {

// Why the run fails, one phrase per reason joined by "; " ("" when it passes): growth suspects,
// invalid frees, and device memory live above `leak_bytes` (UINT64_MAX: not checked).
std::string exit_verdict(const ReportData& r, uint64_t leak_bytes);

}  // namespace gpushim
