// A pool's figures (reserved, cached, segment calls): what every DeviceMemoryResource reports and
// the report, the live metrics and gpushim_* show. Here, not in report/, so that the pools do not
// depend on the report (report/ reads policy/, never the other way).
#pragma once

#include <cstdint>

namespace gpushim {

// Counters that the pool policies add (issue: caching pool). All zero under passthrough except
// reserved, which equals allocated there.
struct PoolFigures {
  uint64_t requested_bytes = 0;        // what callers asked for, live
  uint64_t peak_requested_bytes = 0;
  uint64_t reserved_bytes = 0;         // held from the driver
  uint64_t peak_reserved_bytes = 0;
  uint64_t cached_free_bytes = 0;      // reserved but not handed out (includes quarantine)
  uint64_t quarantined_bytes = 0;      // freed, waiting for the work queued before the free to finish
  uint64_t largest_free_block = 0;
  uint64_t segment_allocs = 0;
  uint64_t segment_frees = 0;
  uint64_t alloc_retries = 0;
  uint64_t ooms = 0;
  uint64_t reuse_syncs = 0;            // device synchronizations paid to make freed memory reusable
  uint64_t reuse_waits = 0;            // waits for one epoch of frees (not the device) instead of growing
  uint64_t map_calls = 0;              // vmm policy
  uint64_t unmap_calls = 0;
  uint64_t mapped_bytes = 0;
  uint64_t host_bytes = 0;             // the pool's own metadata in host memory (in shim_host_bytes)
  uint64_t cuda_pools_kept_bytes = 0;  // in reserved: what CUDA's own pools hold beyond their allocations
};

}  // namespace gpushim
