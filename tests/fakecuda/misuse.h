// How the simulated device stops a process at a misuse that CUDA leaves undefined (a destroyed
// handle, a runtime called while the process tears it down): one line on stderr, like a
// sanitizer, and the process ends at once with kMisuseExitStatus (no atexit handler runs), where
// NVIDIA's libraries would crash or silently corrupt. FAKECUDA_MISUSE_ABORT=1 makes it abort()
// instead, for a core file or a debugger's backtrace. Shared by the driver and the runtime.
#pragma once

#include <unistd.h>

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace fakecuda {

// The exit status of a process stopped at a misuse (neither a signal nor a status CUDA programs
// or the test harnesses use).
inline constexpr int kMisuseExitStatus = 86;

[[noreturn]] inline void VStopForMisuse(const char* fmt, va_list ap) {
  char line[512];
  int n = std::snprintf(line, sizeof(line), "fakecuda: misuse: ");
  n += std::vsnprintf(line + n, sizeof(line) - static_cast<std::size_t>(n) - 1, fmt, ap);
  if (n > static_cast<int>(sizeof(line)) - 2) n = static_cast<int>(sizeof(line)) - 2;
  line[n++] = '\n';
  // One write(): the line stays whole among other threads' output.
  ssize_t ignored = write(STDERR_FILENO, line, static_cast<std::size_t>(n));
  (void)ignored;
  const char* abort_env = std::getenv("FAKECUDA_MISUSE_ABORT");
  if (abort_env != nullptr && abort_env[0] == '1') std::abort();
  _exit(kMisuseExitStatus);
}

[[noreturn]] inline __attribute__((format(printf, 1, 2))) void StopForMisuse(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VStopForMisuse(fmt, ap);
}

}  // namespace fakecuda
