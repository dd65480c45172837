#include "util/write_fully.h"

#include <errno.h>
#include <unistd.h>

#include "util/no_write_signals.h"

namespace gpushim {

int write_fully(int fd, const void* data, size_t n) {
  const ScopedNoWriteSignals no_write_signals;
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) {  // cannot happen for regular files; do not spin if it does
      errno = EIO;
      return EIO;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace gpushim
