// Which allocation sites leak: a pure function over the per-site series of live bytes, so the
// verdict is unit-tested on synthetic series.
//
// A site is a growth suspect when its live memory grew steadily through the run:
//   - many samples: at least `min_samples` points;
//   - never back to baseline: the baseline is the lowest value in the first `baseline_fraction`
//     of the series; once the site rose above it, it never came back down to it;
//   - a monotone trend: Kendall's tau of bytes over time is at least `min_trend` (1 = only ever
//     up, 0 = no trend), and it rose at `min_increases` distinct points or more;
//   - still growing at the end: the last value is above the value at the start of the last
//     `late_fraction` of the series (a cache that filled up during warm-up and then stayed flat
//     is not a leak).
// Large but flat sites (model weights, allocated once) have no trend and are never suspects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/iteration_counter.h"

namespace gpushim {

// What made a checkpoint, when the iteration count did: the allocation that began an iteration
// at GPUSHIM_ITERATION_SITE (taken right after it), or a mark (gpushim_mark_iteration, taken at
// it). Points of one kind are at one place of their iteration.
enum class IterationPoint : uint8_t { kNone, kSite, kMark };
// As a trace's checkpoint carries it, beside the iteration sources (format 1.7): written by the
// shim's recorder, read back by gpushim-analyze.
inline unsigned checkpoint_flag(IterationPoint p) {
  return p == IterationPoint::kSite   ? IterationCounter::kCheckpointAtSiteIteration
         : p == IterationPoint::kMark ? IterationCounter::kCheckpointAtMark
                                      : 0u;
}
inline IterationPoint iteration_point_of_checkpoint(unsigned sources) {
  return (sources & IterationCounter::kCheckpointAtMark) != 0             ? IterationPoint::kMark
         : (sources & IterationCounter::kCheckpointAtSiteIteration) != 0 ? IterationPoint::kSite
                                                                         : IterationPoint::kNone;
}

struct SitePoint {
  uint64_t t_ns;       // since the shim started
  uint64_t bytes;      // live bytes of the site
  uint64_t count;      // live allocations of the site
  uint64_t iteration;  // iterations counted so far (0 without marks)
  uint64_t instant = 0;  // the site history's checkpoint number (from 1); 0: not from a history
  uint64_t allocs = 0;   // allocations made in the process so far (PeriodDetector::allocations)
  // Taken because the iteration count reached a checkpoint, and at which kind of place: between
  // points of one kind, bytes per iteration are exact.
  IterationPoint at_iteration = IterationPoint::kNone;
};

struct GrowthParams {
  size_t min_samples = 8;
  double baseline_fraction = 0.125;
  double min_trend = 0.5;
  size_t min_increases = 3;
  double late_fraction = 1.0 / 3;
};

struct GrowthFinding {
  size_t series = 0;             // index of the input series
  uint64_t baseline_bytes = 0;
  uint64_t growth_bytes = 0;     // last - baseline
  uint64_t live_bytes = 0;       // at the last point
  uint64_t live_count = 0;
  double bytes_per_s = 0;        // least-squares slope over the series
  bool has_iterations = false;   // iterations advanced during the series
  double bytes_per_iteration = 0;// least-squares slope against the iteration count
  uint64_t iterations = 0;       // iterations during the series
  double trend = 0;              // Kendall's tau
  size_t samples = 0;
  uint64_t first_t_ns = 0, last_t_ns = 0;
};

// Findings for the series that are suspects, largest growth first.
std::vector<GrowthFinding> detect_growth(const std::vector<std::vector<SitePoint>>& series, const GrowthParams& params = {});

}  // namespace gpushim
