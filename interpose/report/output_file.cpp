#include "report/output_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "util/log.h"
#include "util/paths.h"
#include "util/write_fully.h"

namespace gpushim {
namespace {

// Enough for many ranks of one job writing the same template into one directory, without
// spinning forever when something else keeps answering "exists".
constexpr int kMaxSuffix = 10000;

std::string host_name() {
  char buf[256];
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknownhost";
  buf[sizeof(buf) - 1] = '\0';
  return buf[0] != '\0' ? buf : "unknownhost";
}

// "dir/gpushim.prog.12.json" + 3 -> "dir/gpushim.prog.12.3.json".
std::string with_suffix(const std::string& path, int n) {
  return insert_before_extension(path, "." + std::to_string(n));
}

// Errors that say the directory, not the name, is the problem: worth trying $TMPDIR. A path too
// long for the system (ENAMETOOLONG) is one too: the short $TMPDIR path usually works.
bool is_directory_error(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == ENOENT || err == ENOTDIR || err == ENAMETOOLONG;
}

// A file name the fallback directory accepts: a name past NAME_MAX keeps its start and its
// extension, cut in between.
std::string fitting_name(std::string name) {
  constexpr size_t kMax = 200;  // NAME_MAX (255) less room for a ".NNNN" suffix
  if (name.size() <= kMax) return name;
  const size_t dot = name.find_last_of('.');
  const std::string ext = dot != std::string::npos && name.size() - dot <= 16 ? name.substr(dot) : "";
  return name.substr(0, kMax - ext.size()) + ext;
}

// A value put into a file name by a template field (%r, %h, %p): one path component, never "..",
// a separator or a control character, whatever the environment says (RANK=../../x stays in the
// directory the template names).
std::string file_name_component(const std::string& value) {
  std::string out;
  for (const char c : value.substr(0, 128)) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '-' || c == '_' || c == '+';
    out += safe ? c : '_';
  }
  if (out.empty() || out.find_first_not_of('.') == std::string::npos) out = std::string(out.empty() ? 1 : out.size(), '_');
  return out;
}

// Errors that say something already sits at the name: O_EXCL's EEXIST, O_NOFOLLOW's ELOOP for a
// symlink (some kernels and filesystems answer that one first), EISDIR for a directory.
bool is_exists_error(int err) { return err == EEXIST || err == ELOOP || err == EISDIR; }

enum class Result { kWritten, kDirectoryError, kFailed, kUnsupported };

// The kernel takes the umask off O_CREAT's and O_TMPFILE's mode: under umask 0777 a report would
// be mode 0000, unreadable by the user who asked for it. A file we just created is ours to set.
// A filesystem without modes refuses; the file is still written.
void owner_only(int fd) { (void)::fchmod(fd, 0600); }

void log_write_failure(const std::string& path, size_t bytes, int e) {
  if (e == ENOSPC || e == EDQUOT)
    log_line("no space left writing %s (%zu bytes); partial file removed", path.c_str(), bytes);
  else
    log_line("cannot write %s: %s; partial file removed", path.c_str(), std::strerror(e));
}

// `s` as one shell word, for a command a message suggests.
std::string shell_word(const std::string& s) {
  constexpr char kPlain[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@%";
  if (!s.empty() && s.find_first_not_of(kPlain) == std::string::npos) return s;
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The same file name in $TMPDIR (else /tmp), for when `path`'s directory refused it with `err`.
// False, after the one-line message, when that is where `path` already was.
bool fallback_in_tmpdir(const std::string& path, int err, std::string* fallback) {
  const char* tmpdir = getenv("TMPDIR");
  std::string dir = (tmpdir != nullptr && tmpdir[0] != '\0') ? tmpdir : "/tmp";
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  *fallback = (dir == "/" ? "/" : dir + "/") + fitting_name(std::string(base_name(path)));
  if (dir_name(path) == dir || *fallback == path) {
    log_line("cannot create %s: %s", path.c_str(), cannot_create_reason(path, err).c_str());
    return false;
  }
  return true;
}

// Preferred: the whole file is written unnamed (O_TMPFILE, mode 0600) and linked under its name
// only once complete, so no reader ever sees a partial report, not even after kill -9 or a full
// disk in the middle of the write. link() never replaces anything (EEXIST: try the next suffix)
// and never follows a symlink at the name. kUnsupported when the kernel, the filesystem or a
// missing /proc cannot do it; the named path below runs then.
Result write_unnamed_then_link(const std::string& path, const std::string& data, std::string* written, int* err) {
  int fd;
  do {
    fd = ::open(dir_name(path).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (!is_directory_error(errno)) return Result::kUnsupported;  // EOPNOTSUPP, EISDIR, EINVAL
    *err = errno;
    return Result::kDirectoryError;
  }
  owner_only(fd);
  const int e = write_fully(fd, data.data(), data.size());  // a file-size limit costs the file, not the host
  if (e != 0) {
    ::close(fd);  // the unnamed file disappears with its descriptor
    *err = e;
    log_write_failure(path, data.size(), e);
    return Result::kFailed;
  }
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  for (int n = 0; n <= kMaxSuffix; ++n) {
    const std::string candidate = n == 0 ? path : with_suffix(path, n);
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, candidate.c_str(), AT_SYMLINK_FOLLOW) == 0) {
      ::close(fd);
      *written = candidate;
      return Result::kWritten;
    }
    if (errno == EEXIST) continue;
    if (errno == EINTR) {
      --n;
      continue;
    }
    ::close(fd);
    return Result::kUnsupported;
  }
  ::close(fd);
  *err = EEXIST;
  log_line("cannot create %s: %d suffixed names already exist", path.c_str(), kMaxSuffix);
  return Result::kFailed;
}

enum class OpenResult { kOpened, kDirectoryError, kFailed };

// Creates `path` or the first free suffixed variant (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600). On
// kDirectoryError, *err is the errno that blamed the directory.
OpenResult open_in_dir(const std::string& path, int* fd_out, std::string* written, int* err) {
  for (int n = 0; n <= kMaxSuffix; ++n) {
    const std::string candidate = n == 0 ? path : with_suffix(path, n);
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      owner_only(fd);
      *fd_out = fd;
      *written = candidate;
      return OpenResult::kOpened;
    }
    const int e = errno;
    if (is_exists_error(e)) continue;
    if (e == EINTR) {
      --n;
      continue;
    }
    *err = e;
    if (is_directory_error(e)) return OpenResult::kDirectoryError;
    log_line("cannot create %s: %s", candidate.c_str(), std::strerror(e));
    return OpenResult::kFailed;
  }
  *err = EEXIST;
  log_line("cannot create %s: %d suffixed names already exist", path.c_str(), kMaxSuffix);
  return OpenResult::kFailed;
}

// Tries `path`, then its suffixed variants, in one directory. On kWritten, *written is the name.
// On kDirectoryError, *err is the errno that blamed the directory.
Result write_in_dir(const std::string& path, const std::string& data, std::string* written, int* err) {
  if (const Result r = write_unnamed_then_link(path, data, written, err); r != Result::kUnsupported) return r;
  int fd = -1;
  std::string candidate;
  switch (open_in_dir(path, &fd, &candidate, err)) {
    case OpenResult::kDirectoryError:
      return Result::kDirectoryError;
    case OpenResult::kFailed:
      return Result::kFailed;
    case OpenResult::kOpened:
      break;
  }
  int e = write_fully(fd, data.data(), data.size());  // a file-size limit costs the file, not the host
  // close() is where NFS and some FUSE filesystems report deferred write errors.
  if (::close(fd) != 0 && e == 0 && errno != EINTR) e = errno;
  if (e != 0) {
    ::unlink(candidate.c_str());  // a truncated report would mislead more than a missing one
    *err = e;
    log_write_failure(candidate, data.size(), e);
    return Result::kFailed;
  }
  *written = candidate;
  return Result::kWritten;
}

// A path naming an existing character device (/dev/null, a terminal) is where the user wants
// the output, not a file to keep: writing there overwrites nothing, and adding a suffix would
// create /dev/null.1 instead. lstat does not follow links, so /dev/stderr (a symlink) and any
// link planted at the name still take the safe path below; FIFOs do too (opening one for writing
// could block the host's exit until a reader comes). Returns the descriptor, or -1 when `path`
// is not such a device or cannot be opened.
int open_existing_char_device(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return -1;
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  // Checked again on the open descriptor: the name may have been replaced since the lstat.
  if (::fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int standard_stream_of(const std::string& path) {
  // By name, not through the link: /dev/stdout leads to /proc/self/fd/1, which may be a pipe or a
  // regular file the shell opened; opening that anew would write from its start, over the
  // program's own output.
  if (path == "/dev/stdout" || path == "/dev/fd/1" || path == "/proc/self/fd/1") return 1;
  if (path == "/dev/stderr" || path == "/dev/fd/2" || path == "/proc/self/fd/2") return 2;
  return -1;
}

std::string cannot_create_reason(const std::string& path, int err) {
  struct stat st;
  const std::string dir = dir_name(path);
  // A relative name (the working directory was unknown) may start with '-': "--" keeps mkdir from
  // taking it for an option, so that the command is safe to paste.
  if (err == ENOENT && ::stat(dir.c_str(), &st) != 0 && errno == ENOENT)
    return "its directory " + dir + " does not exist (gpushim creates no directories: mkdir -p " +
           (dir[0] == '-' ? "-- " : "") + shell_word(dir) + ")";
  return std::strerror(err);
}

std::string working_directory() {
  char cwd[PATH_MAX];
  return ::getcwd(cwd, sizeof cwd) != nullptr ? std::string(cwd) : std::string();
}

std::string anchored_at(const std::string& path, const std::string& dir) {
  if (path.empty() || path[0] == '/' || dir.empty()) return path;
  return dir == "/" ? "/" + path : dir + "/" + path;
}

std::string expand_path_template(const std::string& tmpl, const std::string& exe_name, int pid,
                                 const char* default_suffix) {
  std::string exe(base_name(exe_name));
  if (exe.empty()) exe = "unknown";
  const std::string default_name =
      "gpushim." + exe + "." + std::to_string(pid) + (default_suffix != nullptr ? default_suffix : "");
  if (tmpl.empty()) return default_name;

  std::string out;
  out.reserve(tmpl.size() + 32);
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if (c != '%' || i + 1 == tmpl.size()) {
      out += c;  // a lone trailing '%' stays literal
      continue;
    }
    const char k = tmpl[++i];
    switch (k) {
      case 'p':
        out += std::to_string(pid);
        break;
      case 'h':
        out += file_name_component(host_name());
        break;
      case 'r': {
        const char* rank = getenv("RANK");
        out += (rank != nullptr && rank[0] != '\0') ? file_name_component(rank) : "norank";
        break;
      }
      case '%':
        out += '%';
        break;
      default:  // unknown directives stay as written, so a typo is visible in the file name
        out += '%';
        out += k;
        break;
    }
  }
  // A template naming a directory ("reports/") gets the default file name inside it.
  if (out.back() == '/') out += default_name;
  return out;
}

std::string write_new_file(const std::string& path, const std::string& data, WhereAllowed where) {
  if (path.empty()) {
    log_line("cannot write a report: empty output path");
    return "";
  }
  if (const int stream = standard_stream_of(path); stream >= 0) {
    // What the program printed before is still in stdio's buffer (fully buffered into a pipe or
    // a file): out first, or the report lands inside the program's output, splitting a line. Only
    // if no other thread is writing to it this moment: the report never waits for the program.
    FILE* const program_stream = stream == 1 ? stdout : stderr;
    if (ftrylockfile(program_stream) == 0) {
      fflush_unlocked(program_stream);
      funlockfile(program_stream);
    }
    const int e = write_fully(stream, data.data(), data.size());
    if (e == 0) return path;
    log_line("cannot write %s: %s", path.c_str(), std::strerror(e));
    return "";
  }
  if (const int fd = open_existing_char_device(path); fd >= 0) {
    const int e = write_fully(fd, data.data(), data.size());
    ::close(fd);
    if (e == 0) return path;
    log_line("cannot write %s: %s", path.c_str(), std::strerror(e));
    return "";
  }
  std::string written;
  int err = 0;
  Result r = write_in_dir(path, data, &written, &err);
  if (r == Result::kWritten) return written;
  if (r == Result::kFailed) return "";

  std::string fallback;
  if (where == WhereAllowed::kNamedPathOnly) {
    log_line("cannot create %s: %s", path.c_str(), cannot_create_reason(path, err).c_str());
    return "";
  }
  if (!fallback_in_tmpdir(path, err, &fallback)) return "";
  const int first_err = err;
  r = write_in_dir(fallback, data, &written, &err);
  if (r == Result::kWritten) {
    log_line("cannot create %s (%s); wrote %s instead", path.c_str(), std::strerror(first_err), written.c_str());
    return written;
  }
  if (r == Result::kDirectoryError)
    log_line("cannot create %s (%s) nor %s (%s)", path.c_str(), std::strerror(first_err), fallback.c_str(),
             std::strerror(err));
  return "";
}

int create_new_file(const std::string& path, std::string* written, WhereAllowed where) {
  if (path.empty()) {
    log_line("cannot create a file: empty output path");
    return -1;
  }
  if (const int stream = standard_stream_of(path); stream >= 0) {
    const int fd = ::fcntl(stream, F_DUPFD_CLOEXEC, 3);  // the caller closes what it gets
    if (fd < 0) log_line("cannot write %s: %s", path.c_str(), std::strerror(errno));
    else *written = path;
    return fd;
  }
  if (const int dev = open_existing_char_device(path); dev >= 0) {
    *written = path;
    return dev;
  }
  int fd = -1, err = 0;
  OpenResult r = open_in_dir(path, &fd, written, &err);
  if (r == OpenResult::kOpened) return fd;
  if (r == OpenResult::kFailed) return -1;
  std::string fallback;
  if (where == WhereAllowed::kNamedPathOnly) {
    log_line("cannot create %s: %s", path.c_str(), cannot_create_reason(path, err).c_str());
    return -1;
  }
  if (!fallback_in_tmpdir(path, err, &fallback)) return -1;
  const int first_err = err;
  r = open_in_dir(fallback, &fd, written, &err);
  if (r == OpenResult::kOpened) {
    log_line("cannot create %s (%s); writing %s instead", path.c_str(), std::strerror(first_err), written->c_str());
    return fd;
  }
  if (r == OpenResult::kDirectoryError)
    log_line("cannot create %s (%s) nor %s (%s)", path.c_str(), std::strerror(first_err), fallback.c_str(),
             std::strerror(err));
  return -1;
}

}  // namespace gpushim
