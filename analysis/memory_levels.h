// Allocated and reserved device memory, per device, as a trace's events are applied in order.
// "Reserved" is what the process holds from the driver: the pool's segments (or vmm mappings, a
// physical allocation mapped at two addresses counted once) plus memory CUDA served directly
// (passthrough, graph capture), which has no segment of its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>

#include "accounting/allocation_tracker.h"
#include "trace/trace_event.h"

namespace gpushim::analysis {

class MemoryLevels {
 public:
  struct Device {
    uint64_t allocated = 0, count = 0, segments = 0, forwarded = 0;
    uint64_t reserved() const { return segments + forwarded; }
  };

  // Applies `e`. Returns the device it changed, or null (other memory kinds, marks, OOMs).
  const Device* apply(const trace::TraceEvent& e) {
    using trace::EventKind;
    switch (e.kind) {
      case EventKind::kAlloc:
      case EventKind::kFree: {
        if ((e.flags & trace::kFlagKindMask) != static_cast<uint8_t>(MemoryKind::kDevice)) return nullptr;
        Device& d = devices_[e.device];
        const bool forwarded = (e.flags & trace::kFlagForwarded) != 0;
        if (e.kind == EventKind::kAlloc) {
          d.allocated += e.size;
          ++d.count;
          if (forwarded) d.forwarded += e.size;
        } else {
          d.allocated -= std::min(d.allocated, e.size);
          d.count -= d.count ? 1 : 0;
          if (forwarded) d.forwarded -= std::min(d.forwarded, e.size);
        }
        return &d;
      }
      case EventKind::kSegmentAlloc:
      case EventKind::kSegmentMap: {
        Device& d = devices_[e.device];
        if (!(e.flags & trace::kFlagSharedMapping)) d.segments += e.size;  // reserved at its other address
        return &d;
      }
      case EventKind::kSegmentFree:
      case EventKind::kSegmentUnmap: {
        Device& d = devices_[e.device];
        if (!(e.flags & trace::kFlagSharedMapping)) d.segments -= std::min(d.segments, e.size);
        return &d;
      }
      default: return nullptr;
    }
  }
  const Device& device(int ordinal) { return devices_[ordinal]; }
  const std::map<int, Device>& devices() const { return devices_; }

 private:
  std::map<int, Device> devices_;
};

}  // namespace gpushim::analysis
