// Where snapshot reports go.
#pragma once

#include <cstdint>
#include <string>

namespace gpushim {

// Snapshot `n` (1, 2, ...) of the report at `report_path`: ".snapshot.<n>" inserted before the
// file name's extension ("run/r.json" -> "run/r.snapshot.3.json"; no extension: appended). Never
// the exit report's name, nor one of the ".1", ".2" names it takes when its own name is taken.
std::string snapshot_path(const std::string& report_path, uint64_t n);

}  // namespace gpushim
