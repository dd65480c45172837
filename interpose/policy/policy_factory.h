// Builds the pool a configuration asks for over a given backend. The shim and gpushim-analyze's
// replay both build their pools here, so a replay runs exactly what the shim would have run.
#pragma once

#include <memory>

#include "config/config.h"
#include "policy/backend.h"
#include "policy/caching_pool.h"
#include "policy/device_memory_resource.h"

namespace gpushim {

CachingPoolOptions caching_options(const Config& config);

// Null for passthrough: nothing is pooled, every call is forwarded.
std::unique_ptr<DeviceMemoryResource> make_pool(const Config& config, Backend& backend);

}  // namespace gpushim
