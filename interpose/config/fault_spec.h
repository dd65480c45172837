// GPUSHIM_FAIL: which device allocations the shim fails on purpose, so that users can test their
// out-of-memory handling without filling a GPU. Parsed here; applied by policy/fault_injector.
//
// Comma-separated clauses; an allocation fails if any clause selects it:
//   nth:N        the Nth device allocation of the process (1-based; may be given several times)
//   every:N      every Nth device allocation (the Nth, 2Nth, ...)
//   random:P     each device allocation with probability P (0 < P <= 1), decided by seed and
//                allocation number, so a run is reproducible given the order of allocations
//   seed:S       the seed of random (default 1)
//   above:BYTES  every device allocation asking for more than BYTES (units as in GPUSHIM_LIMIT)
// "off" (the default) injects nothing. Allocations are counted over all threads and devices;
// zero-byte requests and calls CUDA rejects for bad arguments are not counted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpushim {

struct FaultSpec {
  std::vector<uint64_t> nth;  // allocation numbers, 1-based
  uint64_t every = 0;         // 0: none
  double probability = 0;     // 0: none
  uint64_t seed = 1;
  uint64_t above = UINT64_MAX;  // UINT64_MAX: none
  std::string text;             // as the user wrote it, for messages

  bool active() const { return !nth.empty() || every != 0 || probability > 0 || above != UINT64_MAX; }
};

// Returns false (leaving *out untouched) for anything but a valid spec or "off".
bool parse_fault_spec(std::string_view text, FaultSpec* out);

}  // namespace gpushim
