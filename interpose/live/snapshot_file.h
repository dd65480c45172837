// Where snapshot reports go, and how they appear there.
#pragma once

#include <cstdint>
#include <string>

#include "report/output_file.h"

namespace gpushim {

// Snapshot `n` (1, 2, ...) of the report at `report_path`: ".snapshot.<n>" inserted before the
// file name's extension ("run/r.json" -> "run/r.snapshot.3.json"; no extension: appended). Never
// the exit report's name, nor one of the ".1", ".2" names it takes when its own name is taken.
std::string snapshot_path(const std::string& report_path, uint64_t n);

// Writes `data` as a new file named `path` under the rules of write_new_file (never overwriting:
// ".1", ".2", ... before the extension instead; $TMPDIR when the directory is not writable; one
// line on failure), but so that the file appears complete: the data goes to a hidden temporary
// first, which is then hard-linked to the name. Someone waiting for the snapshot (a script, a
// test, inotify) may read it as soon as it exists. Returns the path written, or "".
std::string publish_new_file(const std::string& path, const std::string& data,
                             WhereAllowed where = WhereAllowed::kOrTmpdir);

}  // namespace gpushim
