#include "live/snapshot_file.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "live/replace_file.h"
#include "report/output_file.h"
#include "util/log.h"

namespace gpushim {
namespace {

constexpr int kMaxSuffix = 10000;  // as write_new_file

// "dir/r.snapshot.1.json" + 2 -> "dir/r.snapshot.1.2.json", like write_new_file's suffixes.
std::string with_suffix(const std::string& path, int n) {
  const size_t slash = path.find_last_of('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.find_last_of('.');
  const std::string tag = "." + std::to_string(n);
  if (dot == std::string::npos || dot <= name_start) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

}  // namespace

std::string snapshot_path(const std::string& report_path, uint64_t n) {
  const size_t slash = report_path.find_last_of('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = report_path.find_last_of('.');
  const std::string tag = ".snapshot." + std::to_string(n);
  // A dot that starts the name (".hidden") is not an extension.
  if (dot == std::string::npos || dot <= name_start) return report_path + tag;
  return report_path.substr(0, dot) + tag + report_path.substr(dot);
}

std::string publish_new_file(const std::string& path, const std::string& data) {
  const std::string tmp_wanted = replacement_temp_path(path);
  ::unlink(tmp_wanted.c_str());  // a leftover of a killed process with our pid
  // write_new_file decides the directory ($TMPDIR fallback) and reports failures.
  const std::string tmp = write_new_file(tmp_wanted, data);
  if (tmp.empty()) return "";
  const size_t tmp_slash = tmp.find_last_of('/');
  const size_t path_slash = path.find_last_of('/');
  const std::string dir = tmp_slash == std::string::npos ? "" : tmp.substr(0, tmp_slash + 1);
  const std::string name = path_slash == std::string::npos ? path : path.substr(path_slash + 1);
  for (int n = 0; n <= kMaxSuffix; ++n) {
    const std::string candidate = n == 0 ? dir + name : with_suffix(dir + name, n);
    // link() fails with EEXIST instead of replacing: the never-overwrite rule, atomically.
    if (::link(tmp.c_str(), candidate.c_str()) == 0) {
      ::unlink(tmp.c_str());
      return candidate;
    }
    if (errno == EEXIST) continue;
    if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == EMLINK) {
      // No hard links on this filesystem: rename still makes it appear complete, and the name
      // was free a moment ago.
      struct stat st;
      if (::lstat(candidate.c_str(), &st) == 0) continue;
      if (::rename(tmp.c_str(), candidate.c_str()) == 0) return candidate;
    }
    const int err = errno;
    ::unlink(tmp.c_str());
    log_line("cannot create %s: %s", candidate.c_str(), std::strerror(err));
    return "";
  }
  ::unlink(tmp.c_str());
  log_line("cannot create %s: %d suffixed names already exist", path.c_str(), kMaxSuffix);
  return "";
}

}  // namespace gpushim
