// Live bytes and count of every allocation site over time, for growth (leak) detection.
//
// Sampled at the time series' sampling points (no thread of its own), from the per-site totals
// the AllocationTracker already keeps, so tracking costs nothing per allocation. Memory stays
// bounded: at most `max_sites` sites (the largest, when there are more) with at most
// `max_points` points each; a full series keeps every other point and samples half as often, so
// it always spans the site's whole life at an even resolution. A site whose live memory returns
// to zero has its history dropped: it is not growing.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "accounting/growth_detector.h"

namespace gpushim {

struct SiteSeries {
  SiteKey key;
  std::vector<SitePoint> points;  // oldest first
};

class SiteHistory {
 public:
  explicit SiteHistory(size_t max_sites = 2048, size_t max_points = 64) : max_sites_(max_sites), max_points_(max_points) {}

  // One sampling instant: every site with live memory now, and the iteration count. False (and
  // nothing kept) when an instant after `t_ns` was already taken: another thread's view, read
  // before that one and late to the lock, is stale and must not end the series.
  // `allocs`: allocations made so far, which places the instant in the loop's detected steps.
  // `at_iteration`: what in the iteration count triggered this instant (SitePoint::at_iteration).
  bool sample(uint64_t t_ns, uint64_t iteration, std::vector<std::pair<SiteKey, SiteTotals>> sites,
              uint64_t allocs = 0, IterationPoint at_iteration = IterationPoint::kNone);

  // Copies of every series, each ending at the latest instant (even when thinning skipped it),
  // so that a verdict taken now covers the run up to now.
  std::vector<SiteSeries> series() const;
  // Sampling instants so far.
  uint64_t samples() const;
  // The time of the latest instant kept (0: none yet). sample() refuses an older one.
  uint64_t last_instant_ns() const;
  size_t memory_bytes() const;

  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 private:
  struct Track {
    std::vector<SitePoint> points;
    uint64_t stride = 1;       // keep the instants that are multiples of `stride`
    uint64_t seen = 0;         // the last instant the site had live memory
    bool has_latest = false;   // `latest` is the latest instant, not kept in `points`
    SitePoint latest{};
  };
  const size_t max_sites_;
  const size_t max_points_;
  mutable std::mutex mu_;
  absl::flat_hash_map<SiteKey, Track> tracks_;
  uint64_t instants_ = 0;
  uint64_t last_t_ns_ = 0;
};

}  // namespace gpushim
