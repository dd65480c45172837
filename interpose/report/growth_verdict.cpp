#include "report/growth_verdict.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "accounting/growth_detector.h"
#include "util/iteration_counter.h"
#include "accounting/memory_kind.h"
#include "stacks/site_identity.h"

namespace gpushim {

GrowthReport judge_growth(const std::vector<SiteSeries>& series, const GrowthEvidence& evidence,
                          const SiteFrames& frames_of) {
  GrowthReport g;
  g.samples = evidence.samples;
  g.iterations = evidence.iterations;
  g.iteration_source = IterationCounter::source_name(evidence.iteration_sources);
  const DetectedPeriod detected = g.iterations == 0 ? evidence.detected : DetectedPeriod{};
  if (detected.period != 0) {
    g.iterations = detected.iterations;
    g.iteration_source = "detected";
    g.detected_period = detected.period;
  }

  std::vector<std::vector<SitePoint>> points;
  points.reserve(series.size());
  for (const SiteSeries& s : series) points.push_back(s.points);
  absl::flat_hash_map<std::string, size_t> by_identity;
  for (const GrowthFinding& f : detect_growth(points)) {
    const SiteKey& key = series[f.series].key;
    std::vector<FrameInfo> frames = frames_of(key);
    double per_iteration = f.has_iterations ? f.bytes_per_iteration : std::numeric_limits<double>::quiet_NaN();
    // Detected iterations are not on the points: the growth over the loop's iterations.
    if (detected.iterations > 1 && !f.has_iterations)
      per_iteration = static_cast<double>(f.growth_bytes) / static_cast<double>(detected.iterations - 1);
    auto [it, fresh] = by_identity.emplace(site_identity(key.device, memory_kind_name(key.kind), frames), g.suspects.size());
    if (!fresh) {
      GrowthSuspectReport& m = g.suspects[it->second];
      m.growth_bytes += f.growth_bytes;
      m.bytes_per_s += f.bytes_per_s;
      m.bytes_per_iteration += per_iteration;
      m.live_bytes += f.live_bytes;
      m.live_count += f.live_count;
      m.samples = std::max<uint64_t>(m.samples, f.samples);
      m.first_s = std::min(m.first_s, static_cast<double>(f.first_t_ns) / 1e9);
      m.last_s = std::max(m.last_s, static_cast<double>(f.last_t_ns) / 1e9);
      m.trend = std::min(m.trend, f.trend);
      m.iterations = std::max(m.iterations, f.iterations);
      m.stack_id = std::min(m.stack_id, key.stack);
      continue;
    }
    GrowthSuspectReport s;
    s.device = key.device;
    s.kind = memory_kind_name(key.kind);
    s.growth_bytes = f.growth_bytes;
    s.bytes_per_s = f.bytes_per_s;
    s.bytes_per_iteration = per_iteration;
    s.iterations = f.has_iterations ? f.iterations : detected.iterations;
    s.live_bytes = f.live_bytes;
    s.live_count = f.live_count;
    s.samples = f.samples;
    s.first_s = static_cast<double>(f.first_t_ns) / 1e9;
    s.last_s = static_cast<double>(f.last_t_ns) / 1e9;
    s.trend = f.trend;
    s.stack_id = key.stack;
    s.frames = std::move(frames);
    g.suspects.push_back(std::move(s));
  }
  // Ties (and merged suspects) in a fixed order, so that both sides list them alike.
  std::stable_sort(g.suspects.begin(), g.suspects.end(), [](const GrowthSuspectReport& a, const GrowthSuspectReport& b) {
    if (a.growth_bytes != b.growth_bytes) return a.growth_bytes > b.growth_bytes;
    return a.live_bytes > b.live_bytes;
  });
  // Counted iterations are the program's own clock: fewer than the detector needs points is too
  // little to call a site steady, whatever the checkpoints say. Without them, the checkpoints are.
  const uint64_t needed = GrowthParams{}.min_samples;
  const uint64_t seen = g.iterations ? g.iterations : g.samples;
  const char* unit = g.iterations ? "iteration" : "checkpoint";
  g.evidence = std::to_string(seen) + " " + unit + (seen == 1 ? "" : "s") + (detected.period ? " detected" : " seen") +
               ", " + std::to_string(needed) + " needed";
  if (seen < needed) {
    g.verdict = "not judged";
    g.suspects.clear();
  } else {
    g.verdict = g.suspects.empty() ? "none" : "suspects";
  }
  return g;
}

}  // namespace gpushim
