#include "util/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "util/write_fully.h"

namespace gpushim {
namespace {
std::atomic<bool> g_enabled{true};
}

void set_log_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

void log_line(const char* fmt, ...) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  char buf[1024];
  constexpr char kPrefix[] = "gpushim: ";
  size_t n = sizeof(kPrefix) - 1;
  std::memcpy(buf, kPrefix, n);
  va_list ap;
  va_start(ap, fmt);
  int w = std::vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
  va_end(ap);
  if (w < 0) return;
  n += static_cast<size_t>(w) < sizeof(buf) - n - 1 ? static_cast<size_t>(w) : sizeof(buf) - n - 2;
  // A message is one line by contract: fold embedded newlines so log scrapers see one record.
  for (size_t i = sizeof(kPrefix) - 1; i < n; ++i)
    if (buf[i] == '\n') buf[i] = ' ';
  buf[n++] = '\n';
  // write_fully: a host whose stderr is a file past its RLIMIT_FSIZE loses the line, not its life.
  (void)write_fully(STDERR_FILENO, buf, n);
}

}  // namespace gpushim
