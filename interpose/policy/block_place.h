// Where a block lies in its segment, as a pool that knows it (DeviceMemoryResource::places_blocks)
// tells the hooks: what the "non-releasable" figures (accounting/torch_stats.h) are kept from.
#pragma once

#include <cstdint>

namespace gpushim {

struct BlockPlace {
  uint64_t segment_size = 0;
  bool alone = false;       // no other live block in the segment
  bool gap_before = false;  // free space right before the block, inside the segment
  bool gap_after = false;
};

}  // namespace gpushim
