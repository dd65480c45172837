#include "accounting/period_detector.h"

#include <vector>

namespace gpushim {

DetectedPeriod PeriodDetector::detect(double min_match) const {
  const uint64_t total = count_.load(std::memory_order_relaxed);
  const uint64_t n = total < kRing ? total : kRing;
  if (n < 6) return {};
  std::vector<uint32_t> h(n);  // oldest first
  const uint64_t first = total - n;
  for (uint64_t i = 0; i < n; ++i) h[i] = ring_[(first + i) & (kRing - 1)].load(std::memory_order_relaxed);
  // Candidates: the distances back to earlier allocations of the last one's site, nearest first.
  for (uint64_t j = n - 1; j-- > 0;) {
    if (h[j] != h[n - 1]) continue;
    const uint64_t p = n - 1 - j;
    if (p * 3 > n) break;
    // From where does the sequence follow the period? Walk back from the end while it does,
    // allowing the odd mismatch (an allocation made once every few steps).
    uint64_t matches = 0, checked = 0, start = n;
    for (uint64_t i = n; i-- > p;) {
      ++checked;
      matches += h[i] == h[i - p];
      if (static_cast<double>(matches) >= min_match * static_cast<double>(checked)) start = i - p;
      else if (checked > 4 * p) break;
    }
    if (n - start < 3 * p) continue;
    // Iterations: the anchor (the last allocation's site) occurs `per` times in each period; a
    // warm-up before `start` (model loading) may reuse a site, but not the anchor's position in it.
    uint64_t per = 0, seen = 0;
    for (uint64_t i = n - p; i < n; ++i) per += h[i] == h[n - 1];
    for (uint64_t i = start; i < n; ++i) seen += h[i] == h[n - 1];
    // The ring wrapped inside the loop: the loop began before it, its earlier steps are estimated.
    const uint64_t before = start == 0 ? first / p : 0;
    DetectedPeriod out{p, seen / per + before, first + start, start == 0 && first > 0, {}};
    out.loop.assign(h.begin() + static_cast<std::ptrdiff_t>(start), h.end());
    return out;
  }
  return {};
}

}  // namespace gpushim
