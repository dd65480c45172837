// The one growth definition: the report's growth section from the per-site series of (logical
// time, live bytes) checkpoints. The shim calls it when it writes a report; gpushim-analyze calls
// it on the same checkpoints replayed from a trace (the shim records each one there), so a report
// and the trace of the same run give the same verdict, suspects and evidence.
//
// A site's series is judged by detect_growth (accounting/growth_detector.h: at least 8 points, a
// steady rise by Kendall's tau, never back to its baseline, still rising at the end). Series whose
// stacks symbolize alike (stacks/site_identity.h) are summed into one before they are judged, so
// a suspect's live figures are its site's. Without counted iterations, the loop's period is found
// in the allocation sequence, and the program's own step inside it (report/step_finder.h): growth
// is then per step, and a pattern spanning several steps is said so. The verdict is "not judged"
// when the run shows fewer iterations (counted, or detected steps) than the detector needs points,
// or, without iterations, fewer checkpoints, and then says how many more it needs: thin evidence
// never reads as "none". Without iterations, a site that rose only while the process allocated
// nothing else (a load loop) is no suspect: the evidence says it was set aside.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "accounting/period_detector.h"
#include "accounting/site_history.h"
#include "report/report_model.h"

namespace gpushim {

struct GrowthEvidence {
  uint64_t samples = 0;        // checkpoints taken (SiteHistory::samples)
  uint64_t iterations = 0;     // counted iterations at the last checkpoint
  unsigned iteration_sources = 0;  // IterationCounter::Source bits
  DetectedPeriod detected;     // the allocation sequence's period; only used without counted iterations
};

using SiteFrames = std::function<std::vector<FrameInfo>(const SiteKey&)>;

GrowthReport judge_growth(const std::vector<SiteSeries>& series, const GrowthEvidence& evidence,
                          const SiteFrames& frames_of);

// What a growth rate per iteration (GrowthSuspectReport::bytes_per_iteration) is per: "step" when
// the program's steps were found inside the allocation pattern (GrowthReport::steps_per_pattern
// non-zero), else "iteration" (counted ones, or the pattern itself). The one word of the shim's
// summary, its OOM advice, the verdict's evidence and gpushim-analyze.
const char* growth_unit(uint64_t steps_per_pattern);

}  // namespace gpushim
