// One-line diagnostics on stderr, always prefixed "gpushim: ".
//
// Each line is formatted into a stack buffer and written with a single write(2), so lines from
// concurrent threads never interleave, and no heap allocation happens (safe in fork children,
// at exit and from paths that hold our locks).
#pragma once

namespace gpushim {

void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Silences log_line (used by tests that provoke errors on purpose). Not for production paths.
void set_log_enabled(bool enabled);

}  // namespace gpushim
