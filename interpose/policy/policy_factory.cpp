#include "policy/policy_factory.h"

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

std::unique_ptr<DeviceMemoryResource> make_pool(const Config& config, Backend& backend) {
  switch (config.policy) {
    case PolicyKind::kPassthrough: return nullptr;
    case PolicyKind::kCaching: return std::make_unique<CachingPool>(backend, caching_options(config));
    case PolicyKind::kVmm: return nullptr;  // replaced when the vmm policy lands
  }
  return nullptr;
}

}  // namespace gpushim
