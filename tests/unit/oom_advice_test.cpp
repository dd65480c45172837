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

}  // namespace
}  // namespace gpushim
