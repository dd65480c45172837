#include "policy/policy_factory.h"

#include "policy/own_segments.h"
#include "policy/reservation_counter.h"

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
    case PolicyKind::kVmm: return nullptr;  // replaced when the vmm policy lands
  }
  return nullptr;
}

}  // namespace gpushim
