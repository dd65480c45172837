#include "live/snapshot_file.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "live/replace_file.h"
#include "report/output_file.h"
#include "util/log.h"
#include "util/paths.h"

namespace gpushim {
namespace {

constexpr int kMaxSuffix = 10000;  // as write_new_file

}  // namespace

std::string snapshot_path(const std::string& report_path, uint64_t n) {
  return insert_before_extension(report_path, ".snapshot." + std::to_string(n));
}

std::string publish_new_file(const std::string& path, const std::string& data, WhereAllowed where) {
  // A named path's missing directory is told as the report's would be, by the snapshot's name (the
  // hidden temporary below would otherwise be the name the line gives).
  struct stat st;
  if (where == WhereAllowed::kNamedPathOnly && ::stat(dir_name(path).c_str(), &st) != 0 && errno == ENOENT) {
    log_line("cannot create %s: %s", path.c_str(), cannot_create_reason(path, ENOENT).c_str());
    return "";
  }
  // A name of its own (write_new_file never replaces a file that is there, nor removes one): the
  // temporary of a process with the same pid in another container may sit beside it.
  const std::string tmp_wanted = replacement_temp_path(path);
  // write_new_file decides the directory ($TMPDIR fallback) and reports failures.
  const std::string tmp = write_new_file(tmp_wanted, data, where);
  if (tmp.empty()) return "";
  const size_t tmp_slash = tmp.find_last_of('/');
  const size_t path_slash = path.find_last_of('/');
  const std::string dir = tmp_slash == std::string::npos ? "" : tmp.substr(0, tmp_slash + 1);
  const std::string name = path_slash == std::string::npos ? path : path.substr(path_slash + 1);
  for (int n = 0; n <= kMaxSuffix; ++n) {
    const std::string candidate = n == 0 ? dir + name : insert_before_extension(dir + name, "." + std::to_string(n));
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
