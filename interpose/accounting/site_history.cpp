#include "accounting/site_history.h"

#include <algorithm>

namespace gpushim {

bool SiteHistory::sample(uint64_t t_ns, uint64_t iteration, std::vector<std::pair<SiteKey, SiteTotals>> sites,
                         uint64_t allocs, IterationPoint at_iteration) {
  if (sites.size() > max_sites_) {
    // Ties broken by stack id, so that the same sites stay tracked from one instant to the next.
    std::nth_element(sites.begin(), sites.begin() + static_cast<std::ptrdiff_t>(max_sites_), sites.end(),
                     [](const auto& a, const auto& b) {
                       if (a.second.bytes != b.second.bytes) return a.second.bytes > b.second.bytes;
                       return a.first.stack < b.first.stack;
                     });
    sites.resize(max_sites_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (instants_ != 0 && t_ns < last_t_ns_) return false;
  last_t_ns_ = t_ns;
  const uint64_t now = ++instants_;
  for (const auto& [key, totals] : sites) {
    if (totals.count == 0) continue;
    Track& t = tracks_[key];
    t.seen = now;
    const SitePoint point{t_ns, totals.bytes, totals.count, iteration, now, allocs, at_iteration};
    // A kept checkpoint is a multiple of the track's stride (a power of two), whatever the track's
    // age: the instants a coarse track keeps are kept by every finer track alive then, so series
    // of one site can be summed exactly (report/growth_verdict.cpp). The first point is the
    // baseline and always stays.
    if (!t.points.empty() && now % t.stride != 0) {
      t.latest = point;
      t.has_latest = true;
      continue;
    }
    t.has_latest = false;
    t.points.push_back(point);
    while (t.points.size() >= max_points_) {
      t.stride *= 2;
      size_t kept = 1;
      for (size_t i = 1; i < t.points.size(); ++i)
        if (t.points[i].instant % t.stride == 0) t.points[kept++] = t.points[i];
      t.points.resize(kept);
    }
  }
  // Sites with nothing live (or no longer among the largest) lose their history.
  absl::erase_if(tracks_, [now](const auto& kv) { return kv.second.seen != now; });
  return true;
}

std::vector<SiteSeries> SiteHistory::series() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SiteSeries> out;
  out.reserve(tracks_.size());
  for (const auto& [key, t] : tracks_) {
    out.push_back(SiteSeries{key, t.points});
    if (t.has_latest) out.back().points.push_back(t.latest);
  }
  return out;
}

uint64_t SiteHistory::last_instant_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_t_ns_;
}

uint64_t SiteHistory::samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return instants_;
}

size_t SiteHistory::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = tracks_.capacity() * (sizeof(SiteKey) + sizeof(Track) + 1);
  for (const auto& [key, t] : tracks_) n += t.points.capacity() * sizeof(SitePoint);
  return n;
}

}  // namespace gpushim
