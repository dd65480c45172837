#include "accounting/site_history.h"

#include <algorithm>

namespace gpushim {

bool SiteHistory::sample(uint64_t t_ns, uint64_t iteration, std::vector<std::pair<SiteKey, SiteTotals>> sites) {
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
    const SitePoint point{t_ns, totals.bytes, totals.count, iteration};
    if (!t.points.empty() && ++t.since_kept < t.stride) {
      t.latest = point;
      t.has_latest = true;
      continue;
    }
    t.since_kept = 0;
    t.has_latest = false;
    t.points.push_back(point);
    if (t.points.size() >= max_points_) {
      size_t kept = 0;
      for (size_t i = 0; i < t.points.size(); i += 2) t.points[kept++] = t.points[i];
      t.points.resize(kept);
      t.stride *= 2;
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
