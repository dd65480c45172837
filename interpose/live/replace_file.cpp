#include "live/replace_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include "util/no_sigxfsz.h"
#include "util/write_fully.h"

namespace gpushim {
std::string replacement_temp_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + name + ".tmp." + std::to_string(getpid());
}

int replace_file_atomically(const std::string& path, const std::string& data, struct stat* written) {
  if (path.empty() || path.back() == '/') return EISDIR;
  const std::string tmp = replacement_temp_path(path);
  // A leftover of this pid (an earlier process killed mid-write, or our own failed attempt) would
  // make O_EXCL fail forever. O_EXCL|O_NOFOLLOW then refuses anything planted at the name.
  ::unlink(tmp.c_str());
  int fd;
  do {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  int err;
  {
    // The last update is written from the host's exiting thread, where SIGXFSZ would end the
    // host: a file-size limit must cost the update only.
    const ScopedNoSigxfsz no_sigxfsz;
    err = write_fully(fd, data.data(), data.size());
    if (err == 0 && written != nullptr && ::fstat(fd, written) != 0) err = errno;
    // close() is where NFS reports deferred write errors.
    if (::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  }
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) ::unlink(tmp.c_str());
  return err;
}

}  // namespace gpushim
