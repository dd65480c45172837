#include "accounting/growth_detector.h"

#include <algorithm>
#include <cmath>

namespace gpushim {
namespace {

// Slope of y against x by least squares; 0 when x does not vary.
template <typename X, typename Y>
double slope(const std::vector<SitePoint>& p, X x, Y y) {
  const double n = static_cast<double>(p.size());
  double mx = 0, my = 0;
  for (const SitePoint& s : p) mx += x(s), my += y(s);
  mx /= n, my /= n;
  double sxy = 0, sxx = 0;
  for (const SitePoint& s : p) {
    const double dx = x(s) - mx;
    sxy += dx * (y(s) - my);
    sxx += dx * dx;
  }
  return sxx > 0 ? sxy / sxx : 0;
}

bool evaluate(const std::vector<SitePoint>& p, const GrowthParams& params, GrowthFinding* f) {
  const size_t n = p.size();
  if (n < params.min_samples || n < 2) return false;
  const size_t window = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(n) * params.baseline_fraction));
  uint64_t baseline = p[0].bytes;
  for (size_t i = 1; i < window; ++i) baseline = std::min(baseline, p[i].bytes);
  size_t rise = n;
  for (size_t i = 0; i < n; ++i)
    if (p[i].bytes > baseline) {
      rise = i;
      break;
    }
  if (rise == n) return false;  // never above its baseline: flat
  for (size_t i = rise; i < n; ++i)
    if (p[i].bytes <= baseline) return false;  // came back down: not a leak
  size_t increases = 0;
  for (size_t i = 1; i < n; ++i) increases += p[i].bytes > p[i - 1].bytes;
  if (increases < params.min_increases) return false;
  const size_t late = std::min(n - 1, static_cast<size_t>(static_cast<double>(n - 1) * (1 - params.late_fraction)));
  if (p[n - 1].bytes <= p[late].bytes) return false;  // stopped growing
  int64_t s = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) s += (p[j].bytes > p[i].bytes) - (p[j].bytes < p[i].bytes);
  const double tau = static_cast<double>(s) / (static_cast<double>(n) * static_cast<double>(n - 1) / 2);
  if (tau < params.min_trend) return false;

  f->baseline_bytes = baseline;
  f->growth_bytes = p[n - 1].bytes - baseline;
  f->live_bytes = p[n - 1].bytes;
  f->live_count = p[n - 1].count;
  f->trend = tau;
  f->samples = n;
  f->first_t_ns = p[0].t_ns;
  f->last_t_ns = p[n - 1].t_ns;
  auto bytes = [](const SitePoint& q) { return static_cast<double>(q.bytes); };
  f->bytes_per_s = slope(p, [](const SitePoint& q) { return static_cast<double>(q.t_ns) / 1e9; }, bytes);
  f->iterations = p[n - 1].iteration - p[0].iteration;
  f->has_iterations = f->iterations >= 2;
  if (f->has_iterations) {
    auto iteration = [](const SitePoint& q) { return static_cast<double>(q.iteration); };
    // Best, the points the iteration count itself triggered, of one kind (marks' first, which
    // are at the mark; with GPUSHIM_ITERATION_SITE as well, the site's are elsewhere in the step):
    // each at the same place in its iteration, so a leak of exactly L per step gives exactly L
    // (the points of the event schedule fall before or after the leaking call, and measured
    // 987.6 KiB for 1 MiB per marked step).
    auto points_of = [&](IterationPoint kind) {
      std::vector<SitePoint> out;
      for (const SitePoint& q : p)
        if (q.at_iteration == kind && (out.empty() || out.back().iteration != q.iteration)) out.push_back(q);
      return out;
    };
    std::vector<SitePoint> at_iterations = points_of(IterationPoint::kMark);
    if (at_iterations.size() < 2) at_iterations = points_of(IterationPoint::kSite);
    // Otherwise against the state at each iteration's end (its last point): all the points
    // together bend the slope at the series' ends (an exact 128 KiB per step measured 126.6 KiB).
    std::vector<SitePoint> ends;
    for (size_t i = 0; i < n; ++i)
      if (i + 1 == n || p[i + 1].iteration != p[i].iteration) ends.push_back(p[i]);
    f->bytes_per_iteration = at_iterations.size() >= 2 ? slope(at_iterations, iteration, bytes)
                             : ends.size() >= 2         ? slope(ends, iteration, bytes)
                                                        : slope(p, iteration, bytes);
  }
  return true;
}

}  // namespace

std::vector<GrowthFinding> detect_growth(const std::vector<std::vector<SitePoint>>& series, const GrowthParams& params) {
  std::vector<GrowthFinding> out;
  for (size_t i = 0; i < series.size(); ++i) {
    GrowthFinding f;
    if (!evaluate(series[i], params, &f)) continue;
    f.series = i;
    out.push_back(f);
  }
  std::sort(out.begin(), out.end(), [](const GrowthFinding& a, const GrowthFinding& b) {
    if (a.growth_bytes != b.growth_bytes) return a.growth_bytes > b.growth_bytes;
    return a.bytes_per_s > b.bytes_per_s;
  });
  return out;
}

}  // namespace gpushim
