// The growth section as the JSON writer and the stderr summary render it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "report/report_writer.h"
#include "test_frames.h"

namespace gpushim {
namespace {

ReportData WithGrowth(bool per_iteration) {
  ReportData r;
  r.pid = 7;
  r.exe = "/usr/bin/python3.11";
  r.policy = "caching";
  r.python = "3.11.7";
  r.growth.samples = 57;
  r.growth.iterations = per_iteration ? 120 : 0;
  r.growth.iteration_source = per_iteration ? "marks" : "none";
  GrowthSuspectReport g;
  g.device = 0;
  g.growth_bytes = 60ull << 20;
  g.bytes_per_s = 25.5 * (1 << 20);
  g.bytes_per_iteration = per_iteration ? 1048576.0 : std::numeric_limits<double>::quiet_NaN();
  g.iterations = per_iteration ? 60 : 0;
  g.live_bytes = 61ull << 20;
  g.live_count = 61;
  g.samples = 57;
  g.first_s = 0.5;
  g.last_s = 2.5;
  g.trend = 0.98;
  g.stack_id = 33;
  FrameInfo native;
  native.function = "ffi_call";
  native.module = "/lib/libffi.so.8";
  for (int i = 0; i < 6; ++i) g.frames.push_back(native);  // more than the summary shows
  g.frames.push_back(python_frame("leaky_step", "/w/train.py", 23));
  g.frames.push_back(python_frame("<module>", "/w/train.py", 40));
  r.growth.suspects.push_back(g);
  SiteReport s;
  s.live_bytes = 256ull << 20;
  s.live_count = 4;
  s.stack_id = 5;
  s.frames.push_back(python_frame("load_model", "/w/train.py", 12));
  r.sites.push_back(s);
  return r;
}

TEST(GrowthReport, JsonSectionComesBeforeSitesWithEveryField) {
  const std::string j = report_to_json(WithGrowth(true));
  const char* keys[] = {"\"python\":\"3.11.7\"", "\"growth\":{\"samples\":57,\"iterations\":120,\"iteration_source\":\"marks\"",
                        "\"suspects\":[", "\"growth_bytes\":62914560", "\"bytes_per_s\":26738688.0",
                        "\"bytes_per_iteration\":1048576.0", "\"iterations\":60", "\"live_bytes\":63963136",
                        "\"live_count\":61", "\"samples\":57", "\"first_s\":0.5", "\"last_s\":2.5", "\"trend\":0.98",
                        "\"stack_id\":33", "\"frames\":[", "\"function\":\"leaky_step\"", "\"sites\":["};
  size_t at = 0;
  for (const char* k : keys) {
    const size_t pos = j.find(k, at);
    ASSERT_NE(pos, std::string::npos) << k << " missing or out of order in\n" << j;
    at = pos;
  }
}

TEST(GrowthReport, NoIterationsIsNull) {
  const std::string j = report_to_json(WithGrowth(false));
  EXPECT_NE(j.find("\"bytes_per_iteration\":null"), std::string::npos) << j;
  EXPECT_NE(j.find("\"iteration_source\":\"none\""), std::string::npos);
  ReportData empty;
  EXPECT_NE(report_to_json(empty).find("\"growth\":{\"samples\":0,\"iterations\":0,\"iteration_source\":\"none\",\"detected_period\":0,\"steps_per_pattern\":0,\"step_function\":\"\",\"verdict\":\"not judged\",\"evidence\":\"\",\"suspects\":[]}"),
            std::string::npos);
}

std::string Summary(const ReportData& r) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  write_summary(r, "/tmp/r.json", 5, f);
  fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}

TEST(GrowthReport, SummaryRanksSuspectsAboveLiveSitesAndShowsPythonFrames) {
  const std::string s = Summary(WithGrowth(true));
  const size_t growth = s.find("gpushim: growth suspects (live memory that grew steadily; 57 instants sampled, 120 iterations):\n");
  const size_t sites = s.find("gpushim: top live allocation sites:\n");
  ASSERT_NE(growth, std::string::npos) << s;
  ASSERT_NE(sites, std::string::npos) << s;
  EXPECT_LT(growth, sites);
  EXPECT_NE(s.find("gpushim:   #1 +60.0 MiB over 2.00 s (1.0 MiB per iteration, 25.5 MiB/s); live 61.0 MiB in 61 "
                   "allocations (device 0)\n"
                   "gpushim:       at leaky_step (train.py:23)\n"
                   "gpushim:       at <module> (train.py:40)\n"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("ffi_call"), std::string::npos) << "Python frames shown when the stack does not fit";
  const std::string no_iterations = Summary(WithGrowth(false));
  EXPECT_NE(no_iterations.find("57 instants sampled):\n"), std::string::npos) << no_iterations;
  EXPECT_NE(no_iterations.find("(25.5 MiB/s)"), std::string::npos) << no_iterations;
  ReportData none = WithGrowth(true);
  none.growth.suspects.clear();
  EXPECT_EQ(Summary(none).find("growth suspects"), std::string::npos);
}

}  // namespace
}  // namespace gpushim
