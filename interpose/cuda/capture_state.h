// How many stream captures (CUDA graphs) are in progress in this process. Maintained by the
// capture hooks; read by pools, which must neither synchronize nor query events meanwhile.
#pragma once

#include <atomic>

namespace gpushim {

inline std::atomic<int>& active_captures() {
  static std::atomic<int> n{0};
  return n;
}

}  // namespace gpushim
