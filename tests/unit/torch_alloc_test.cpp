// GPUSHIM_TORCH_ALLOC: the one definition the preload's constructor, the config and the launcher
// share (config/torch_alloc.h).
#include "config/torch_alloc.h"

#include <gtest/gtest.h>

#include <string>

#include "config/config.h"

namespace gpushim {
namespace {

TEST(TorchAlloc, ParsesLikeTheConfigTable) {
  TorchAlloc t = TorchAlloc::kKeep;
  EXPECT_TRUE(parse_torch_alloc(nullptr, &t));
  EXPECT_EQ(t, TorchAlloc::kAsync);
  EXPECT_TRUE(parse_torch_alloc(" NO-CACHE\t", &t));
  EXPECT_EQ(t, TorchAlloc::kNoCache);
  EXPECT_TRUE(parse_torch_alloc("keep", &t));
  EXPECT_EQ(t, TorchAlloc::kKeep);
  for (const char* bad : {"", " ", "asyn", "async,keep", "nocache", "0", "off"}) {
    EXPECT_FALSE(parse_torch_alloc(bad, &t)) << bad;
    // The config refuses exactly what the constructor ignores, with one error.
    const ConfigResult r = parse_config(std::vector<std::pair<std::string, std::string>>{{kTorchAllocVariable, bad}});
    EXPECT_EQ(r.errors.size(), 1u) << bad;
  }
  const ConfigResult r = parse_config(std::vector<std::pair<std::string, std::string>>{{kTorchAllocVariable, "Keep"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.config.torch_alloc, TorchAlloc::kKeep);
}

TEST(TorchAlloc, TheUsersOwnSettingsWin) {
  auto route = [](TorchAlloc t, const char* conf, const char* nocache) {
    const TorchRoute r = torch_route(t, conf, nocache);
    return r.name ? std::string(r.name) + "=" + r.value : std::string();
  };
  EXPECT_EQ(route(TorchAlloc::kAsync, nullptr, nullptr), "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync");
  EXPECT_EQ(route(TorchAlloc::kAsync, "expandable_segments:True", nullptr), "");
  EXPECT_EQ(route(TorchAlloc::kAsync, nullptr, "0"), "");
  EXPECT_EQ(route(TorchAlloc::kAsync, "", nullptr), "");  // set, even empty: the user's
  EXPECT_EQ(route(TorchAlloc::kNoCache, nullptr, nullptr), "PYTORCH_NO_CUDA_MEMORY_CACHING=1");
  EXPECT_EQ(route(TorchAlloc::kNoCache, "backend:native", nullptr), "PYTORCH_NO_CUDA_MEMORY_CACHING=1");
  EXPECT_EQ(route(TorchAlloc::kNoCache, nullptr, "0"), "");
  EXPECT_EQ(route(TorchAlloc::kKeep, nullptr, nullptr), "");
}

TEST(TorchAlloc, WhenPyTorchsCacheStaysInCharge) {
  EXPECT_TRUE(torch_cache_in_charge(nullptr, nullptr));
  EXPECT_TRUE(torch_cache_in_charge("expandable_segments:True", nullptr));
  EXPECT_TRUE(torch_cache_in_charge("backend:native", nullptr));
  EXPECT_FALSE(torch_cache_in_charge("backend:cudaMallocAsync", nullptr));
  EXPECT_FALSE(torch_cache_in_charge("expandable_segments:False,backend:cudaMallocAsync", nullptr));
  EXPECT_FALSE(torch_cache_in_charge(nullptr, "1"));
  EXPECT_FALSE(torch_cache_in_charge("expandable_segments:True", "0"));  // PyTorch: set at all is on
}

}  // namespace
}  // namespace gpushim
