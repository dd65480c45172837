// summary --site: the tree of one site's function, over every site that runs through it.
#include <gtest/gtest.h>

#include <string>

#include "run_view.h"
#include "summary_views.h"
#include "util/text.h"

namespace gpushim::analysis {
namespace {

FrameInfo program_frame(const char* function, int line) {
  FrameInfo f;
  f.function = function;
  f.file = "train.cpp";
  f.line = line;
  f.module = "/opt/job/train";
  return f;
}

SiteView step_site(int device, uint64_t at_peak) {
  SiteView s;
  s.device = device;
  s.has_history = true;
  s.at_device_peak_bytes = at_peak;
  s.peak_bytes = at_peak;
  s.total_allocs = 4;
  s.frames = {program_frame("train_step", 12), program_frame("main", 40)};
  return s;
}

// Each device reaches its peak at its own moment: the tree at the peak added device 1's bytes to
// device 0's, a figure that was never live at once anywhere.
TEST(SiteTree, AtThePeakCountsOnlyTheChosenSitesDevice) {
  RunView run;
  run.source = "trace";
  run.sites = {step_site(0, 10u << 20), step_site(1, 30u << 20)};
  const std::string on0 = site_tree(run, run.sites[0], /*at_peak=*/true, 8);
  EXPECT_NE(on0.find("10.0 MiB at device 0's peak, 4 allocations over the run, in 1 site"), std::string::npos) << on0;
  const std::string on1 = site_tree(run, run.sites[1], /*at_peak=*/true, 8);
  EXPECT_NE(on1.find("30.0 MiB at device 1's peak"), std::string::npos) << on1;
  // What is live at the end is live at one moment on every device: it adds up.
  run.sites[0].live_bytes = 1u << 20;
  run.sites[1].live_bytes = 2u << 20;
  const std::string live = site_tree(run, run.sites[0], /*at_peak=*/false, 8);
  EXPECT_NE(live.find("3.0 MiB live at the end, 8 allocations over the run, in 2 sites"), std::string::npos) << live;
}

TEST(SiteTree, OneDeviceSaysThePeakAsBefore) {
  RunView run;
  run.source = "trace";
  run.sites = {step_site(0, 10u << 20), step_site(0, 6u << 20)};
  const std::string t = site_tree(run, run.sites[0], /*at_peak=*/true, 8);
  EXPECT_NE(t.find("16.0 MiB at the peak, 8 allocations over the run, in 2 sites"), std::string::npos) << t;
}

TEST(SiteTree, OneAllocationIsSaidInTheSingular) {
  // "64.0 MiB in 1 allocations", "1 allocations over the run": summary's lines for a site that
  // allocated once, which most runs have (a model's weights, a workspace).
  RunView run;
  run.source = "trace";
  run.sites = {step_site(0, 10u << 20)};
  run.sites[0].total_allocs = 1;
  const std::string t = site_tree(run, run.sites[0], /*at_peak=*/true, 8);
  EXPECT_NE(t.find("10.0 MiB at the peak, 1 allocation over the run, in 1 site"), std::string::npos) << t;
  EXPECT_EQ(t.find("1 allocations"), std::string::npos) << t;
  EXPECT_EQ(plural(1, "allocation"), "1 allocation");
  EXPECT_EQ(plural(0, "allocation"), "0 allocations");
  EXPECT_EQ(plural(2, "free"), "2 frees");
}

}  // namespace
}  // namespace gpushim::analysis
