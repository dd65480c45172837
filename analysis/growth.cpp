#include "growth.h"

#include <algorithm>

namespace gpushim::analysis {

GrowthVerdict judge_growth(const std::vector<uint64_t>& values, const std::vector<double>& times_s) {
  GrowthVerdict v;
  size_t n = std::min(values.size(), times_s.size());
  if (n < 4) return v;
  // A program that exits cleanly frees its leaks too: ignore a final descent from the highest
  // value, as long as the rise to it spans most of the run.
  size_t top = 0;
  for (size_t k = 0; k < n; ++k)
    if (values[k] >= values[top]) top = k;
  if (top + 1 < n && top >= 3 && 5 * top >= 3 * (n - 1)) n = top + 1;
  int up = 0, down = 0;
  bool left_baseline = false;
  for (size_t k = 1; k < n; ++k) {
    if (values[k] > values[k - 1]) ++up;
    if (values[k] < values[k - 1]) ++down;
    if (values[k] > values[0]) left_baseline = true;
    else if (left_baseline) return v;  // came back to the baseline: a cycle, not a leak
  }
  const int steps = static_cast<int>(n - 1);
  v.steps = steps;
  v.grew_bytes = values[n - 1] - values[0];
  v.seconds = times_s[n - 1] - times_s[0];
  v.suspect = values[n - 1] > values[0] && 2 * up >= steps && 10 * down <= steps;
  return v;
}

}  // namespace gpushim::analysis
