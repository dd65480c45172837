// The program's own step in a loop nobody marked (docs/python.md, "Growth"). The period detector
// (accounting/period_detector.h) finds the shortest repeating unit of the allocation sequence; in
// a training or serving loop whose shapes cycle (sequence lengths, bucketed batch sizes) and whose
// number of temporaries depends on the shape, that unit spans several steps. Growth per step, and
// a verdict after a few dozen steps, need the steps themselves.
//
// The step is the call of the innermost user function that every allocation of the pattern runs
// inside (for Python programs the step function, `train_step`, or the body of the loop in `main`;
// for native programs the same, from native frames): a new call starts when an allocation is
// made at an earlier place in that function than the one before it (a Python line, a native return
// address), the function having started over. Places that repeat (a loop over layers calling one
// line) stay inside one step. Limits, by construction: a step function that allocates at a single
// place, or where none of its own loops allocate at two places in turn, is found (its pattern is
// then the step itself); one whose own loop alternates between two allocating lines counts each
// pass as a step (GPUSHIM_ITERATION_SITE or gpushim_mark_iteration() is exact).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "accounting/period_detector.h"
#include "stacks/symbolizer.h"

namespace gpushim {

struct DetectedSteps {
  uint64_t per_pattern = 0;  // steps in one period of the allocation sequence; 0: none found
  uint64_t steps = 0;        // steps of the loop so far
  std::string function;      // the step's function as the stacks name it
  uint64_t before = 0;       // steps estimated before the oldest allocation kept (ring wrapped)
  uint64_t loop_begin = 0;   // allocation number where the kept loop begins
  std::vector<uint64_t> starts;  // allocation number of each kept step's first allocation, ascending

  // Steps begun before allocation number `allocs`: a checkpoint's place on the step axis.
  uint64_t step_at(uint64_t allocs) const;
};

using StackFramesOf = std::function<std::vector<FrameInfo>(uint32_t stack)>;

DetectedSteps find_steps(const DetectedPeriod& period, const StackFramesOf& frames_of);

}  // namespace gpushim
