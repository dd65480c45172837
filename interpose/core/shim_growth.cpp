// Growth (leak) tracking of the Shim: sampling per-site totals at the time series' instants, and
// turning their history into the report's growth section.
#include <algorithm>
#include <cmath>
#include <limits>

#include "accounting/growth_detector.h"
#include "core/shim.h"

namespace gpushim {

void Shim::sample_sites(uint64_t t_ns) {
  // Teardown frees what the program held: its drop must not read as the end of a leak.
  if (teardown_.load(std::memory_order_acquire) != nullptr) return;
  site_history_.sample(t_ns, iterations_.count(), sites());
}

void Shim::add_growth(ReportData* r, Symbolizer& sym, const std::vector<std::pair<SiteKey, SiteTotals>>& live,
                      uint64_t t) {
  GrowthReport& g = r->growth;
  g.samples = site_history_.samples();
  g.iterations = iterations_.count();
  g.iteration_source = iterations_.source_name();
  // No marks: the iterations of the loop, if the allocation sequence repeats (period_detector.h).
  DetectedPeriod detected;
  if (g.iterations == 0 && config_.stack_depth > 0) detected = periods_.detect();
  if (detected.period != 0) {
    g.iterations = detected.iterations;
    g.iteration_source = "detected";
    g.detected_period = detected.period;
  }

  // The present is the last point of every series, so that the verdict covers the run up to
  // this report; a series whose site has nothing live any more has returned to zero.
  absl::flat_hash_map<SiteKey, SiteTotals> now;
  for (const auto& [key, totals] : live) now.emplace(key, totals);
  const uint64_t iteration = iterations_.count();
  std::vector<SiteSeries> series = site_history_.series();
  std::vector<std::vector<SitePoint>> points;
  points.reserve(series.size());
  for (SiteSeries& s : series) {
    auto it = now.find(s.key);
    if (it == now.end()) {
      points.emplace_back();
      continue;
    }
    if (s.points.empty() || s.points.back().t_ns < t)
      s.points.push_back(SitePoint{t, it->second.bytes, it->second.count, iteration});
    points.push_back(std::move(s.points));
  }

  // Stacks that symbolize identically are one site to a reader (as for the live sites).
  absl::flat_hash_map<std::string, size_t> by_frames;
  std::vector<uint64_t> words;
  for (const GrowthFinding& f : detect_growth(points)) {
    const SiteKey& key = series[f.series].key;
    stacks_.frames(key.stack, &words);
    std::vector<FrameInfo> frames;
    std::string identity = std::to_string(key.device) + "|" + memory_kind_name(key.kind);
    for (uint64_t w : words) {
      frames.push_back(sym.resolve(w));
      const FrameInfo& fi = frames.back();
      identity += "|" + fi.module + "|" + fi.function + "|" + fi.file + ":" + std::to_string(fi.line);
      if (fi.function.empty() && fi.file.empty()) identity += "@" + std::to_string(fi.module_offset);
    }
    double per_iteration = f.has_iterations ? f.bytes_per_iteration : std::numeric_limits<double>::quiet_NaN();
    // Detected iterations are not on the points: the growth over the loop's iterations.
    if (detected.iterations > 1 && !f.has_iterations)
      per_iteration = static_cast<double>(f.growth_bytes) / static_cast<double>(detected.iterations - 1);
    auto [it, fresh] = by_frames.emplace(identity, g.suspects.size());
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
  std::stable_sort(g.suspects.begin(), g.suspects.end(), [](const GrowthSuspectReport& a, const GrowthSuspectReport& b) {
    return a.growth_bytes > b.growth_bytes;
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
}

}  // namespace gpushim
