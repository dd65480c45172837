// The figures the metrics file shows: one process, per device. Filled from the live counters while
// the process runs and from the exit report at the end, so the last file matches the report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/memory_figures.h"
#include "report/report_model.h"

namespace gpushim {

// The five figures (accounting/memory_figures.h: live_bytes is gpushim_allocated_bytes, peak_bytes
// gpushim_peak_allocated_bytes) and the device's others.
struct DeviceMetrics : MemoryFigures {
  int device = 0;
  uint64_t reserved_bytes = 0;         // held from the driver
  uint64_t peak_reserved_bytes = 0;
  uint64_t capacity_bytes = 0;         // device total; 0 = unknown
  uint64_t limit_bytes = 0;            // GPUSHIM_LIMIT; 0 = none
  uint64_t failed_allocations = 0;
  uint64_t ooms = 0;
  std::optional<uint64_t> unaccounted_bytes;  // unknown until something measures it

  // The ceiling on what this process may hold: the limit when set (the device can hold no more
  // than its capacity), else the capacity; 0 when neither is known.
  uint64_t cap_bytes() const {
    if (limit_bytes == 0) return capacity_bytes;
    return capacity_bytes != 0 && capacity_bytes < limit_bytes ? capacity_bytes : limit_bytes;
  }
};

// Who the figures belong to; the labels every series carries.
struct ProcessIdentity {
  std::string host;
  int pid = 0;
  std::string rank;        // the RANK variable, "" when unset (as in the report)
  std::string exe_name;    // base name of the executable
  std::string policy;
};

struct ProcessMetrics {
  ProcessIdentity id;
  double start_time_s = 0;   // wall clock when the shim started, seconds since the epoch
  bool running = true;       // false in the last write, at exit
  uint64_t snapshots = 0;    // snapshot reports written so far
  std::vector<DeviceMetrics> devices;
};

// The same figures as a report's device entry shows them.
inline DeviceMetrics device_metrics_from_report(const DeviceReport& d) {
  DeviceMetrics m;
  m.device = d.device;
  m.set_figures(d.figures());
  m.reserved_bytes = d.pool.reserved_bytes;
  m.peak_reserved_bytes = d.peak_reserved_bytes;
  m.capacity_bytes = d.capacity_bytes;
  m.limit_bytes = d.limit_bytes;
  m.failed_allocations = d.failed_allocs;
  m.ooms = d.pool.ooms;
  return m;
}

}  // namespace gpushim
