#include "growth.h"

#include <algorithm>

namespace gpushim::analysis {

GrowthVerdict judge_growth(const std::vector<uint64_t>& values, const std::vector<double>& times_s) {
  GrowthVerdict v;
  const size_t n = std::min(values.size(), times_s.size());
  if (n < 4) return v;
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
