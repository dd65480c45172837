#include "live/snapshot_file.h"

namespace gpushim {

std::string snapshot_path(const std::string& report_path, uint64_t n) {
  const size_t slash = report_path.find_last_of('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = report_path.find_last_of('.');
  const std::string tag = ".snapshot." + std::to_string(n);
  // A dot that starts the name (".hidden") is not an extension.
  if (dot == std::string::npos || dot <= name_start) return report_path + tag;
  return report_path.substr(0, dot) + tag + report_path.substr(dot);
}

}  // namespace gpushim
