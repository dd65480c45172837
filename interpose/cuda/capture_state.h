// How many stream captures (CUDA graphs) are in progress in this process: the size of the stream
// registry's list of captures (stream_registry.h), which the driver's capture hooks, stream
// destruction and context ends keep; read by pools, which must neither synchronize nor query
// events meanwhile.
#pragma once

#include <atomic>

namespace gpushim {

inline std::atomic<int>& active_captures() {
  static std::atomic<int> n{0};
  return n;
}

}  // namespace gpushim
