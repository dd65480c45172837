#include "gpu_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace gpushim::analysis {

const char* gpu_time_name(GpuTime t) {
  switch (t) {
    case GpuTime::kModel: return "model";
    case GpuTime::kRecorded: return "recorded";
    case GpuTime::kInstant: return "instant";
  }
  return "?";
}

bool parse_gpu_time(const std::string& name, GpuTime* out) {
  for (GpuTime t : {GpuTime::kModel, GpuTime::kRecorded, GpuTime::kInstant})
    if (name == gpu_time_name(t)) return *out = t, true;
  return false;
}

DeviceLag DeviceLag::fixed(uint64_t backlog_ns, std::string source) {
  DeviceLag d;
  d.backlog_ns_ = backlog_ns;
  d.source_ = std::move(source);
  return d;
}

DeviceLag DeviceLag::estimate(const std::vector<SimBackend::CompletionSample>& samples, const DeviceLag& fallback) {
  if (samples.empty()) return fallback;
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // Each sample: its lag lies in (lo, hi]; lo < 0 when no query said "not yet".
  struct Interval {
    double lo, hi;
  };
  std::vector<Interval> iv;
  iv.reserve(samples.size());
  for (const auto& s : samples)
    iv.push_back(Interval{s.pending_ns ? static_cast<double>(s.pending_ns - s.recorded_ns) : -1.0,
                          s.done_ns ? static_cast<double>(s.done_ns - s.recorded_ns) : 1e30});
  // 0, then a logarithmic grid from 1 us to 1 s (factor 1.1).
  std::vector<double> grid{0.0};  // 0: the device had finished when the work was queued
  for (double l = 1e3; l <= 1e9; l *= 1.1) grid.push_back(l);
  std::vector<size_t> held(grid.size(), 0);
  size_t best = 0;
  for (size_t g = 0; g < grid.size(); ++g) {
    for (const Interval& i : iv)
      if (i.lo < grid[g] && grid[g] <= i.hi) ++held[g];
    best = std::max(best, held[g]);
  }
  // The widest run of grid points that hold `best` intervals; its geometric middle.
  size_t run_start = 0, run_len = 0, cur_start = 0, cur_len = 0;
  for (size_t g = 0; g < grid.size(); ++g) {
    if (held[g] == best) {
      if (cur_len == 0) cur_start = g;
      if (++cur_len > run_len) run_len = cur_len, run_start = cur_start;
    } else {
      cur_len = 0;
    }
  }
  DeviceLag d;
  d.backlog_ns_ = static_cast<uint64_t>(std::sqrt(grid[run_start] * grid[run_start + run_len - 1]));
  d.samples_ = samples.size();
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "measured: %zu of this trace's fences and events (%zu hold a backlog of %.2f ms; bounded by the "
                "moments the run saw them pending or complete)",
                samples.size(), best, static_cast<double>(d.backlog_ns_) / 1e6);
  d.source_ = buf;

  std::vector<std::pair<uint64_t, uint64_t>> lo, hi;  // (recorded, pending) and (recorded, done)
  for (const auto& s : samples) {
    if (s.pending_ns) lo.emplace_back(s.recorded_ns, s.pending_ns);
    if (s.done_ns) hi.emplace_back(s.recorded_ns, s.done_ns);
  }
  std::sort(lo.begin(), lo.end());
  std::sort(hi.begin(), hi.end());
  uint64_t run = 0;
  for (auto& [r, p] : lo) run = std::max(run, p), p = run;
  run = kNever;
  for (size_t k = hi.size(); k-- > 0;) run = std::min(run, hi[k].second), hi[k].second = run;
  d.not_before_ = std::move(lo);
  d.done_by_ = std::move(hi);
  return d;
}

uint64_t DeviceLag::completes_at(uint64_t r) const {
  uint64_t c = r + backlog_ns_;
  // Done no later than the earliest completion seen of work queued at or after r.
  auto h = std::lower_bound(done_by_.begin(), done_by_.end(), std::make_pair(r, uint64_t{0}));
  if (h != done_by_.end()) c = std::min(c, h->second);
  // Not before the latest "not yet" seen of work queued at or before r.
  auto l = std::upper_bound(not_before_.begin(), not_before_.end(),
                            std::make_pair(r, std::numeric_limits<uint64_t>::max()));
  if (l != not_before_.begin()) c = std::max(c, std::prev(l)->second + 1);
  return std::max(c, r);
}

}  // namespace gpushim::analysis
