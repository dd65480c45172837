#include "live/metrics_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "live/prometheus_text.h"
#include "live/replace_file.h"
#include "report/output_file.h"
#include "util/log.h"
#include "util/write_fully.h"

namespace gpushim {
namespace {
constexpr unsigned kMaxNotices = 5;
// How every metrics file gpushim writes begins (prometheus_text.cpp: HELP lines first).
constexpr char kOurFirstBytes[] = "# HELP gpushim_";

bool written_by_gpushim(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  char head[sizeof(kOurFirstBytes) - 1];
  const bool ours = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                    ::read(fd, head, sizeof(head)) == static_cast<ssize_t>(sizeof(head)) &&
                    std::memcmp(head, kOurFirstBytes, sizeof(head)) == 0;
  ::close(fd);
  return ours;
}

const char* kind_of(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISBLK(mode)) return "a block device";
  return "a file gpushim did not write";
}

}  // namespace

bool MetricsFile::replaceable(const char** what) {
  struct stat st;
  if (::lstat(path_.c_str(), &st) != 0) return true;  // nothing there (or the rename will say why)
  if (S_ISREG(st.st_mode) && dev_ != 0 && st.st_dev == dev_ && st.st_ino == ino_) return true;
  if (S_ISREG(st.st_mode) && written_by_gpushim(path_)) return true;
  *what = kind_of(st.st_mode);
  return false;
}

bool MetricsFile::write_in_place(const std::string& text) {
  int fd = standard_stream_of(path_);
  const bool stream = fd >= 0;
  if (!stream) {
    do {
      fd = ::open(path_.c_str(), O_WRONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
  }
  struct stat st;
  int err = fd < 0 ? errno : 0;
  if (err == 0 && !stream && (::fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode))) err = EEXIST;  // replaced meanwhile
  if (err == 0) err = write_fully(fd, text.data(), text.size());
  if (fd >= 0 && !stream) ::close(fd);
  return err == 0;
}

bool MetricsFile::write(const ProcessMetrics& m) {
  if (refused_) return false;
  struct stat st;
  const bool in_place =
      standard_stream_of(path_) >= 0 || (::lstat(path_.c_str(), &st) == 0 && S_ISCHR(st.st_mode));
  if (in_place) return write_in_place(to_prometheus_text(m));
  const char* what = nullptr;
  if (!replaceable(&what)) {
    refused_ = true;
    log_line("not writing the metrics file %s: it is %s, and gpushim replaces only files it wrote itself",
             path_.c_str(), what);
    return false;
  }
  struct stat written;
  const int err = replace_file_atomically(path_, to_prometheus_text(m), &written);
  if (err == 0) {
    dev_ = written.st_dev;
    ino_ = written.st_ino;
    failing_with_ = 0;
    return true;
  }
  if (err != failing_with_ && notices_ < kMaxNotices) {
    ++notices_;
    log_line("cannot update the metrics file %s: %s; retrying at every update%s", path_.c_str(),
             cannot_create_reason(path_, err).c_str(),
             notices_ == kMaxNotices ? " (further metrics errors are not shown)" : "");
  }
  failing_with_ = err;
  return false;
}

}  // namespace gpushim
