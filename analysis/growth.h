// Leak detection by growth on a trace: a site whose live bytes rise through the run, checkpoint
// after checkpoint, and never come back to where they started. Checkpoints are the iteration marks
// when there are enough of them, else evenly spaced instants.
#pragma once

#include <cstdint>
#include <vector>

namespace gpushim::analysis {

struct GrowthVerdict {
  bool suspect = false;
  uint64_t grew_bytes = 0;
  double seconds = 0;  // between the first and last checkpoint used
  int steps = 0;       // checkpoints used, minus one
};

// `values[k]` is the site's live bytes at checkpoint k, `times_s[k]` when that was; only the
// checkpoints from the site's first allocation on. Suspect when there are at least 4 of them, the
// last is above the first, at least half of the steps go up, at most a tenth go down, and once above
// the first value it never falls back to it. A final descent after the highest value (the program's
// teardown) is ignored when the rise to that value spans at least 60% of the checkpoints.
GrowthVerdict judge_growth(const std::vector<uint64_t>& values, const std::vector<double>& times_s);

}  // namespace gpushim::analysis
