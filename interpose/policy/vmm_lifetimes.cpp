// What VmmLifetimes learns at each free (vmm_lifetimes.h; the measurements behind the thresholds
// are at VmmPoolOptions::long_fall in vmm_arena.h).
#include "policy/vmm_lifetimes.h"

#include <algorithm>

namespace gpushim {

void VmmLifetimes::freed(uint64_t born, uint64_t born_live, uint64_t size, uint64_t live) {
  if (fall_ <= 0) return;
  // The least live bytes since the block's allocation: the first low recorded after it, or what
  // is live now (the block included), or what was live just after it.
  uint64_t least = std::min(born_live, live);
  auto low = std::lower_bound(lows_.begin(), lows_.end(), born,
                              [](const std::pair<uint64_t, uint64_t>& e, uint64_t t) { return e.first < t; });
  if (low != lows_.end()) least = std::min(least, low->second);
  // A trough: live bytes fell well below their level at the allocation and rose well above that
  // low again before the free. A fall alone is not one: blocks freed last in a run of frees see
  // live bytes fall to their own size, and stay where the others were.
  const bool outlived = static_cast<double>(born_live - least) > fall_ * static_cast<double>(born_live) &&
                        static_cast<double>(live - least) > rise_ * static_cast<double>(live);
  seen_trough_ |= outlived;
  auto it = votes_.find(size);
  if (it == votes_.end()) {
    if (outlived && votes_.size() < kMaxLongSizes) votes_.emplace(size, 1);
  } else if (outlived) {
    it->second = static_cast<int8_t>(std::min<int>(it->second + 1, kMaxVotes));
  } else {
    it->second = static_cast<int8_t>(std::max<int>(it->second - 1, -kMaxVotes));
  }
  // What this free leaves live is the newest low (lows_ stays increasing).
  const uint64_t left = live - size;
  while (!lows_.empty() && lows_.back().second >= left) lows_.pop_back();
  // Only a pathological run of frees each leaving more live than the last grows it this far;
  // dropping the oldest entries only makes old blocks look shorter-lived.
  if (lows_.size() == kMaxLows) lows_.erase(lows_.begin(), lows_.begin() + kMaxLows / 2);
  lows_.emplace_back(allocs_, left);
}

}  // namespace gpushim
