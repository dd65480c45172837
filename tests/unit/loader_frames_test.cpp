// called_from_dynamic_loader(): what decides whether an exit may wait for a snapshot (a snapshot
// waits for the loader's lock, which a thread inside the loader holds).
#include "util/loader_frames.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

namespace {
int g_probe_calls = 0;
bool g_probe_inside = false;
}  // namespace

// Called by the probe library's constructor (tests/unit/libs/loader_probe.cpp), found by name.
extern "C" __attribute__((visibility("default"), noinline)) void gpushim_test_loader_probe_report() {
  ++g_probe_calls;
  g_probe_inside = gpushim::called_from_dynamic_loader();
}

TEST(LoaderFrames, AConstructorRunByDlopenIsInsideTheLoader) {
  EXPECT_FALSE(gpushim::called_from_dynamic_loader());
  void* lib = dlopen(GPUSHIM_UNIT_LIB_DIR "/libgpushim_test_loader_probe.so", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  EXPECT_EQ(g_probe_calls, 1);
  EXPECT_TRUE(g_probe_inside);
  dlclose(lib);
  EXPECT_FALSE(gpushim::called_from_dynamic_loader());  // and out of it again
}
