// How much work the randomized and stress tests do: GPUSHIM_TEST_SCALE, as for the e2e modules
// (tests/e2e/shimtest.py's scaled()). The sanitizer runs set it below 1 (scripts/test: their
// instrumented pools run ~10x slower, and the full counts run in the normal build); above 1 it
// runs them longer.
#pragma once

#include <algorithm>
#include <cstdlib>

namespace gpushim {

// `n` times GPUSHIM_TEST_SCALE, never below `minimum`.
inline int scaled(int n, int minimum = 1) {
  const char* s = std::getenv("GPUSHIM_TEST_SCALE");
  const double scale = s != nullptr && *s != '\0' ? std::atof(s) : 1.0;
  return std::max(minimum, static_cast<int>(n * scale));
}

}  // namespace gpushim
