// The OOM section's advice names the cause a reader can act on.
#include "report/oom_advice.h"

#include <gtest/gtest.h>

#include "test_sizes.h"

namespace gpushim {
namespace {

TEST(OomAdvice, ARequestLargerThanTheDeviceSaysSoRatherThanBlamingLiveMemory) {
  OomReport o;
  o.requested = 16 * GiB + 2 * MiB;
  o.capacity = 16 * GiB;
  o.device_free = 16 * GiB;  // nothing live: an out-of-memory probe
  const std::string a = oom_advice(o, "vmm");
  EXPECT_NE(a.find("is larger than the device (16.0 GiB)"), std::string::npos) << a;
  EXPECT_EQ(a.find("Live allocations fill"), std::string::npos) << a;
}

TEST(OomAdvice, ARequestLargerThanTheCapNamesTheCap) {
  OomReport o;
  o.requested = 9 * GiB;
  o.capacity = 16 * GiB;
  o.limit = 8 * GiB;
  o.device_free = 16 * GiB;
  const std::string a = oom_advice(o, "caching");
  EXPECT_NE(a.find("larger than the cap GPUSHIM_LIMIT=8.0 GiB"), std::string::npos) << a;
}

TEST(OomAdvice, LiveMemoryFillingTheDeviceIsStillSaid) {
  OomReport o;
  o.requested = 1 * GiB;
  o.capacity = 16 * GiB;
  o.allocated = 15 * GiB + 512 * MiB;
  o.device_free = 256 * MiB;
  EXPECT_NE(oom_advice(o, "caching").find("Live allocations fill the device"), std::string::npos);
}

// Memory CUDA's own pools keep beyond their allocations is named, with how to get it back.
TEST(OomAdvice, MemoryCudasOwnPoolsKeepIsNamed) {
  OomReport o;
  o.requested = 50 * MiB;
  o.capacity = 16 * GiB;
  o.limit = 256 * MiB;
  o.device_free = 15 * GiB;
  o.allocated = 200 * MiB;
  o.reserved = 328 * MiB;
  o.cuda_pools_kept = 128 * MiB;
  const std::string a = oom_advice(o, "caching");
  EXPECT_NE(a.find("CUDA's own memory pools keep 128.0 MiB beyond what is allocated from them"), std::string::npos) << a;
  EXPECT_NE(a.find("cudaMemPoolTrimTo"), std::string::npos) << a;
  // A little of it beside much live memory is no cause; none is never named.
  o.cuda_pools_kept = 10 * MiB;
  EXPECT_EQ(oom_advice(o, "caching").find("CUDA's own memory pools"), std::string::npos);
  o.cuda_pools_kept = 0;
  o.cached_free = 128 * MiB;
  EXPECT_EQ(oom_advice(o, "vmm").find("CUDA's own memory pools"), std::string::npos);
}

}  // namespace
}  // namespace gpushim
