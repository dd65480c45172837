// Growth (leak) tracking of the Shim: sampling per-site totals at checkpoints (logical time and
// the time series' instants), recording each checkpoint in the trace so that gpushim-analyze can
// replay it, and the report's growth section from the one growth definition (report/growth_verdict.h).
#include <algorithm>

#include "core/shim.h"
#include "report/growth_verdict.h"
#include "trace/trace_recorder.h"

namespace gpushim {

void Shim::sample_sites(uint64_t t_ns) {
  // Teardown frees what the program held: its drop must not read as the end of a leak.
  if (teardown_.load(std::memory_order_acquire) != nullptr) return;
  const uint64_t iteration = iterations_.count();
  // A checkpoint goes into the trace only if the history kept it: the trace replays exactly these.
  if (site_history_.sample(t_ns, iteration, sites()) && trace_) {
    trace::TraceEvent e;
    e.t_ns = t_ns + start_ns_;
    e.size = iteration;
    e.requested = iterations_.sources();
    e.kind = trace::EventKind::kCheckpoint;
    trace_->record(e);
  }
}

void Shim::add_growth(ReportData* r, Symbolizer& sym, uint64_t t) {
  // The present is the last checkpoint, so that the verdict covers the run up to this report
  // (after interpreter shutdown began, sample_sites takes none: that checkpoint was the last).
  // Never older than the latest instant kept, which the history would refuse: the series would
  // then end before the report's own figures.
  sample_sites(std::max(t, site_history_.last_instant_ns()));
  GrowthEvidence evidence;
  evidence.samples = site_history_.samples();
  evidence.iterations = iterations_.count();
  evidence.iteration_sources = iterations_.sources();
  // No marks: the iterations of the loop, if the allocation sequence repeats (period_detector.h).
  if (evidence.iterations == 0 && config_.stack_depth > 0) evidence.detected = periods_.detect();
  std::vector<uint64_t> words;
  r->growth = judge_growth(site_history_.series(), evidence, [&](const SiteKey& key) {
    stacks_.frames(key.stack, &words);
    std::vector<FrameInfo> frames;
    for (uint64_t w : words) frames.push_back(sym.resolve(w));
    return frames;
  });
}

}  // namespace gpushim
