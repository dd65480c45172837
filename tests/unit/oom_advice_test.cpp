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

TEST(OomAdvice, TheLargestSitesShareIsRoundedNotCut) {
  OomReport o;
  o.requested = 1 * GiB;
  o.capacity = 16 * GiB;
  o.device_free = 256 * MiB;
  SiteReport top;
  FrameInfo f;
  f.function = "embed";
  top.frames = {f};
  auto share = [&](uint64_t live, uint64_t allocated) {
    o.allocated = allocated;
    top.live_bytes = live;
    o.top_sites = {top};
    const std::string a = oom_advice(o, "caching");
    const size_t end = a.find("% of allocated memory");
    const size_t start = a.rfind(' ', end) + 1;
    return end == std::string::npos ? std::string("(none)") : a.substr(start, end - start);
  };
  EXPECT_EQ(share(6556, 10000), "66");  // was cut to 65
  EXPECT_EQ(share(9996, 10000), "99");  // part of it is not all of it
  EXPECT_EQ(share(10000, 10000), "100");
  EXPECT_EQ(share(3, 10000), "1");      // some of it is not none of it
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

// A refusal with room left under the cap for the request's own bytes (what a 2 MiB request meets
// when the cap has 14 MiB left and the pool needs a 20 MiB segment) says that the pool's segment
// did not fit, and what to change; a cap with no room left does not.
TEST(OomAdvice, ACapWithRoomForTheRequestButNotItsSegmentSaysSo) {
  OomReport o;
  o.requested = 2 * MiB;
  o.capacity = 16 * GiB;
  o.limit = 350 * MiB;
  o.device_free = 15 * GiB;
  o.allocated = 336 * MiB;
  o.reserved = 336 * MiB;
  const std::string a = oom_advice(o, "caching");
  EXPECT_NE(a.find("The cap still had 14.0 MiB of room, enough for the request itself"), std::string::npos) << a;
  EXPECT_NE(a.find("lower GPUSHIM_LARGE_SEGMENT"), std::string::npos) << a;
  EXPECT_NE(a.find("raise the cap if this job may use more"), std::string::npos) << a;
  const std::string v = oom_advice(o, "vmm");
  EXPECT_NE(v.find("not for the memory the vmm policy takes from the driver"), std::string::npos) << v;
  EXPECT_EQ(v.find("GPUSHIM_LARGE_SEGMENT"), std::string::npos) << v;
  // No room for the request itself: the plain cap advice only.
  o.reserved = 349 * MiB;
  EXPECT_EQ(oom_advice(o, "caching").find("The cap still had"), std::string::npos);
  // Reserved past the cap (CUDA's own pools, say): nothing to say about room.
  o.reserved = 400 * MiB;
  EXPECT_EQ(oom_advice(o, "caching").find("The cap still had"), std::string::npos);
  // A free block that fits was not the problem.
  o.reserved = 336 * MiB;
  o.largest_free_block = 4 * MiB;
  EXPECT_EQ(oom_advice(o, "caching").find("The cap still had"), std::string::npos);
}

// A leak that filled the cap is named beside the largest live site, if it grew from before the error
// on that device.
TEST(OomAdvice, ASiteThatKeptGrowingBeforeTheErrorIsNamed) {
  OomReport o;
  o.device = 0;
  o.t_s = 2.0;
  GrowthReport growth;
  GrowthSuspectReport g;
  g.device = 0;
  g.first_s = 0.5;
  g.growth_bytes = 24 * MiB;
  g.bytes_per_iteration = 1 * MiB;
  FrameInfo f;
  f.function = "leaky_step";
  f.file = "/src/train.cpp";
  f.line = 33;
  g.frames = {f};
  growth.suspects = {g};
  EXPECT_EQ(oom_growth_hint(o, growth),
            "Live memory kept growing at leaky_step at train.cpp:33 (+24.0 MiB over the run, 1.0 MiB per iteration): "
            "that leak, more than any site merely large, is the likely cause; see the growth suspects.");
  // An error before the growth was last seen: what had grown by then, not the whole run's.
  growth.suspects[0].last_s = 10.0;
  growth.suspects[0].bytes_per_s = 4.0 * MiB;
  EXPECT_EQ(oom_growth_hint(o, growth),
            "Live memory kept growing at leaky_step at train.cpp:33 (about +6.0 MiB from 0.50 s to the error at "
            "2.00 s, 1.0 MiB per iteration): that leak, more than any site merely large, is the likely cause; see "
            "the growth suspects.");
  growth.suspects[0].last_s = 0;
  growth.steps_per_pattern = 3;
  EXPECT_NE(oom_growth_hint(o, growth).find("1.0 MiB per step"), std::string::npos);
  // Not when it began after the error, is on another device, or is not device memory.
  growth.suspects[0].first_s = 2.5;
  EXPECT_EQ(oom_growth_hint(o, growth), "");
  growth.suspects[0].first_s = 0.5;
  growth.suspects[0].device = 1;
  EXPECT_EQ(oom_growth_hint(o, growth), "");
  growth.suspects[0].device = 0;
  growth.suspects[0].kind = "host";
  EXPECT_EQ(oom_growth_hint(o, growth), "");
  EXPECT_EQ(oom_growth_hint(o, GrowthReport{}), "");
}

}  // namespace
}  // namespace gpushim
