#include "policy/policy_factory.h"

#include "policy/own_segments.h"
#include "policy/reservation_counter.h"
#include "policy/vmm_pool.h"
#include "util/log.h"

namespace gpushim {

CachingPoolOptions caching_options(const Config& c) {
  CachingPoolOptions o;
  o.round = c.round_bytes;
  o.small_segment = c.small_segment;
  o.large_segment = c.large_segment;
  o.max_split = c.max_split;
  o.quarantine_bytes = c.quarantine_bytes;
  return o;
}

namespace {

// The vmm policy shares the caching policy's rounding and reuse epochs; its own sizes keep their
// defaults (see VmmPoolOptions).
VmmPoolOptions vmm_options(const Config& c) {
  VmmPoolOptions o;
  o.round = c.round_bytes;
  o.quarantine_bytes = c.quarantine_bytes;
  // GPUSHIM_VMM_REUSE=idle is the pool that recorded the traces of before 2026-11-27, whole.
  o.stream_order_builds = c.vmm_stream_order_builds;
  o.wait_before_carve = c.vmm_stream_order_builds;
  o.alias_walled_ends_only = c.vmm_stream_order_builds;
  return o;
}

// GPUSHIM_OWN_SEGMENT_MIN: the configured pool, wrapped so large allocations get their own segment.
std::unique_ptr<DeviceMemoryResource> with_own_segments(const Config& config, Backend& backend) {
  auto counter = std::make_unique<ReservationCounter>(backend);
  Config inner_config = config;
  inner_config.own_segment_min = 0;
  std::unique_ptr<DeviceMemoryResource> inner = make_pool(inner_config, *counter);
  if (inner == nullptr) return nullptr;
  return std::make_unique<OwnSegmentResource>(std::move(counter), std::move(inner), config.own_segment_min,
                                              config.round_bytes);
}

}  // namespace

std::unique_ptr<DeviceMemoryResource> make_pool(const Config& config, Backend& backend) {
  if (config.own_segment_min != 0 && config.policy != PolicyKind::kPassthrough)
    return with_own_segments(config, backend);
  switch (config.policy) {
    case PolicyKind::kPassthrough: return nullptr;
    case PolicyKind::kCaching: return std::make_unique<CachingPool>(backend, caching_options(config));
    case PolicyKind::kVmm:
      // Without virtual memory management (granularity 0) there is nothing to map with: the
      // caching policy is the closest thing, and saying so beats failing every allocation.
      if (backend.granularity() == 0) {
        log_line("GPUSHIM_POLICY=vmm: this device has no virtual memory management; using the caching policy");
        return std::make_unique<CachingPool>(backend, caching_options(config));
      }
      return std::make_unique<VmmPool>(backend, vmm_options(config));
  }
  return nullptr;
}

}  // namespace gpushim
