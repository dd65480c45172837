// The report's per-module table and the driver's view of each device, in JSON and in the summary.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "report/report_writer.h"
#include "test_sizes.h"

namespace gpushim {
namespace {


ReportData sample() {
  ReportData r;
  r.pid = 7;
  r.exe = "/bin/prog";
  r.policy = "caching";
  DeviceReport d;
  d.device = 0;
  d.live_bytes = 40 * MiB;
  d.usage_sampled = true;
  d.usage_at_s = 1.5;
  d.peak_allocated_at_s = 4.25;
  d.pool.segment_allocs = 5;
  d.pool.segment_frees = 2;
  d.pool.alloc_retries = 1;
  d.driver_used_bytes = 364 * MiB;
  d.held_bytes = 64 * MiB;
  d.unaccounted_bytes = 300 * MiB;
  r.devices.push_back(d);
  DeviceReport never = d;
  never.device = 1;
  never.usage_sampled = false;
  never.driver_used_bytes = never.held_bytes = never.unaccounted_bytes = 0;
  r.devices.push_back(never);
  const char* names[] = {"/usr/lib/libnccl.so.2", "/opt/torch/lib/libtorch_cuda.so", "/bin/prog",
                         "/usr/lib/libcublasLt.so.13", "/usr/lib/libcudnn.so.9", "/usr/lib/libextra.so"};
  uint64_t size = 12 * MiB;
  for (const char* n : names) {
    ModuleReport m;
    m.module = n;
    m.device = 0;
    m.live_bytes = size;
    m.live_count = 1;
    m.peak_bytes = size;
    m.total_allocs = 2;
    m.total_frees = 1;
    r.modules.push_back(m);
    size -= 2 * MiB;
  }
  ModuleReport host;
  host.module = "/usr/lib/libnccl.so.2";
  host.device = -1;
  host.kind = "host";
  host.live_bytes = 4096;
  r.modules.push_back(host);
  r.reserved_va_bytes = 8 * MiB;
  return r;
}

TEST(ReportModules, JsonHasTheModulesTableAndTheDriversView) {
  const std::string j = report_to_json(sample());
  EXPECT_NE(j.find("\"reserved_va_bytes\":8388608,\n\"modules\":[\n {\"module\":\"/usr/lib/libnccl.so.2\",\"device\":0,"
                   "\"kind\":\"device\",\"live_bytes\":12582912,\"live_count\":1,\"peak_bytes\":12582912,"
                   "\"total_allocs\":2,\"total_frees\":1}"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("{\"module\":\"/usr/lib/libnccl.so.2\",\"device\":-1,\"kind\":\"host\",\"live_bytes\":4096"),
            std::string::npos);
  EXPECT_NE(j.find("\"usage_at_s\":1.5,\"driver_used_bytes\":381681664,\"held_bytes\":67108864,"
                   "\"unaccounted_bytes\":314572800}"),
            std::string::npos)
      << j;
  // Never sampled: null time, zero figures.
  EXPECT_NE(j.find("\"usage_at_s\":null,\"driver_used_bytes\":0,\"held_bytes\":0,\"unaccounted_bytes\":0}"),
            std::string::npos);
}

TEST(ReportModules, SummaryNamesTheLargestModulesAndUnaccounted) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  ASSERT_NE(out, nullptr);
  write_summary(sample(), "", 5, out);
  std::fclose(out);
  const std::string s(buf, len);
  free(buf);
  EXPECT_NE(s.find("gpushim: device 0 live by module: libnccl.so.2 12.0 MiB, libtorch_cuda.so 10.0 MiB, prog 8.0 MiB, "
                   "libcublasLt.so.13 6.0 MiB, 2 more modules holding 6.0 MiB\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("gpushim: device 0 unaccounted: 300.0 MiB (the driver reported 364.0 MiB in use at 1.50 s, 2.75 s "
                   "before the peak, of which the process held 64.0 MiB;"),
            std::string::npos)
      << s;
  // torch.cuda.memory_summary()'s segment and retry counts, on the device line.
  EXPECT_NE(s.find(", 3 segments held (5 taken, 2 given back), 1 retry\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("device 1 unaccounted"), std::string::npos) << "a device never sampled has no such line";
  EXPECT_EQ(s.find("device 1 live by module"), std::string::npos);
}

std::string summary_of(const ReportData& r) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  write_summary(r, "", 5, out);
  std::fclose(out);
  std::string s(buf, len);
  free(buf);
  return s;
}

// A program that releases its primary context (numba's cuda.close()) or resets its device after
// freeing everything did nothing the summary needs to point at: no line, though the device entry
// still counts the resets. Found by the contexts hunt: every correct driver-API program that
// retained and released its context ended with 'device 0 was reset 1 time; that freed 0 B in 0
// allocations still live'.
TEST(ReportModules, ResetsThatFreedNothingGetNoSummaryLine) {
  ReportData r = sample();
  r.devices[0].resets = 2;
  r.devices[1].context_destroys = 1;
  std::string s = summary_of(r);
  EXPECT_EQ(s.find("was reset"), std::string::npos) << s;
  EXPECT_EQ(s.find("destroyed; that freed"), std::string::npos) << s;
  SiteReport freed;
  freed.device = 0;
  freed.live_bytes = 3 * MiB;
  freed.live_count = 1;
  r.freed_by_reset.push_back(freed);
  s = summary_of(r);
  EXPECT_NE(s.find("gpushim: device 0 was reset 2 times; that freed 3.0 MiB in 1 allocation still live"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("device 1 had"), std::string::npos) << s;
}

// "At the peak" only when the sample was taken then and the process held its peak: in a quick
// program every moment is 0.00 s, and a sample with a quarter of the peak held was called so.
TEST(ReportModules, ASampleIsAtThePeakOnlyWhenThePeakWasHeld) {
  DeviceReport d;
  d.usage_sampled = true;
  d.peak_allocated_at_s = 1.000;
  d.usage_at_s = 1.002;
  d.peak_reserved_bytes = 416 * MiB;
  d.held_bytes = 416 * MiB;
  EXPECT_EQ(sample_vs_peak(d), "at the peak");
  d.held_bytes = 100 * MiB;
  EXPECT_EQ(sample_vs_peak(d), "next to the peak in time, not in memory held");
  d.usage_at_s = 0.6;
  EXPECT_EQ(sample_vs_peak(d), "0.40 s before the peak");
  d.usage_at_s = 1.25;
  EXPECT_EQ(sample_vs_peak(d), "0.25 s after the peak");
}

// Under vmm the pool's driver allocations are cuMemCreate pieces, mapped side by side, and the
// torch table's "GPU reserved segments" are their runs: the demo printed "98 segments held" next
// to a torch table of 1 segment.
TEST(ReportModules, VmmCountsPhysicalAllocationsNotSegments) {
  ReportData r = sample();
  r.policy = "vmm";
  const std::string s = summary_of(r);
  EXPECT_NE(s.find(", 3 physical allocations held (5 created, 2 released), 1 retry\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("segments held"), std::string::npos) << s;
}

}  // namespace
}  // namespace gpushim
