#include "live/prometheus_text.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

namespace gpushim {
namespace {

ProcessMetrics TwoDevices() {
  ProcessMetrics m;
  m.id = {"node7", 4242, "3", "train", "caching"};
  m.start_time_s = 1718000000.25;
  m.snapshots = 2;
  DeviceMetrics d0;
  d0.device = 0;
  d0.live_bytes = 12582912;
  d0.reserved_bytes = 20971520;
  d0.peak_bytes = 41943040;
  d0.peak_reserved_bytes = 67108864;
  d0.capacity_bytes = 85899345920;
  d0.limit_bytes = 8589934592;
  d0.live_count = 3;
  d0.total_allocs = 10;
  d0.total_frees = 7;
  d0.failed_allocations = 2;
  d0.ooms = 1;
  DeviceMetrics d1;
  d1.device = 1;
  d1.live_bytes = 512;
  d1.capacity_bytes = 1024;
  d1.unaccounted_bytes = 314572800;
  m.devices = {d0, d1};
  return m;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// name{labels} -> value, for the samples of the text.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> out;
  for (const std::string& l : Lines(text)) {
    if (l.empty() || l[0] == '#') continue;
    const size_t sp = l.rfind(' ');
    out[l.substr(0, sp)] = l.substr(sp + 1);
  }
  return out;
}

TEST(PrometheusText, EveryFamilyHasHelpAndTypeBeforeItsSamplesAndAppearsOnce) {
  const std::string text = to_prometheus_text(TwoDevices());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::map<std::string, int> seen_type;
  std::string current;
  for (const std::string& l : Lines(text)) {
    if (l.rfind("# HELP ", 0) == 0) {
      current = l.substr(7, l.find(' ', 7) - 7);
      EXPECT_EQ(seen_type.count(current), 0u) << "family twice: " << current;
      continue;
    }
    if (l.rfind("# TYPE ", 0) == 0) {
      const std::string name = l.substr(7, l.find(' ', 7) - 7);
      EXPECT_EQ(name, current);
      const std::string type = l.substr(l.rfind(' ') + 1);
      EXPECT_TRUE(type == "gauge" || type == "counter") << l;
      // Counters end in _total, and only counters do.
      EXPECT_EQ(type == "counter", name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) << name;
      seen_type[name] = 1;
      continue;
    }
    ASSERT_NE(l[0], '#') << l;
    EXPECT_EQ(l.rfind(current + "{", 0), 0u) << "sample outside its family: " << l;
    EXPECT_EQ(l.rfind("gpushim_", 0), 0u);
  }
  EXPECT_GE(seen_type.size(), 14u);
}

TEST(PrometheusText, DeviceFiguresCarryProcessAndDeviceLabels) {
  const auto s = Samples(to_prometheus_text(TwoDevices()));
  const std::string d0 = "{host=\"node7\",pid=\"4242\",rank=\"3\",device=\"0\"}";
  const std::string d1 = "{host=\"node7\",pid=\"4242\",rank=\"3\",device=\"1\"}";
  EXPECT_EQ(s.at("gpushim_allocated_bytes" + d0), "12582912");
  EXPECT_EQ(s.at("gpushim_reserved_bytes" + d0), "20971520");
  EXPECT_EQ(s.at("gpushim_peak_allocated_bytes" + d0), "41943040");
  EXPECT_EQ(s.at("gpushim_peak_reserved_bytes" + d0), "67108864");
  EXPECT_EQ(s.at("gpushim_cap_bytes" + d0), "8589934592");  // the limit, below capacity
  EXPECT_EQ(s.at("gpushim_capacity_bytes" + d0), "85899345920");
  EXPECT_EQ(s.at("gpushim_ooms_total" + d0), "1");
  EXPECT_EQ(s.at("gpushim_failed_allocations_total" + d0), "2");
  EXPECT_EQ(s.at("gpushim_allocations_total" + d0), "10");
  EXPECT_EQ(s.at("gpushim_frees_total" + d0), "7");
  EXPECT_EQ(s.at("gpushim_live_allocations" + d0), "3");
  EXPECT_EQ(s.at("gpushim_cap_bytes" + d1), "1024");  // no limit: the capacity
  // Unaccounted only where it is known.
  EXPECT_EQ(s.at("gpushim_unaccounted_bytes" + d1), "314572800");
  EXPECT_EQ(s.count("gpushim_unaccounted_bytes" + d0), 0u);
  EXPECT_EQ(s.at("gpushim_info{host=\"node7\",pid=\"4242\",rank=\"3\",exe=\"train\",policy=\"caching\"}"), "1");
  EXPECT_EQ(s.at("gpushim_running{host=\"node7\",pid=\"4242\",rank=\"3\"}"), "1");
  EXPECT_EQ(s.at("gpushim_snapshots_total{host=\"node7\",pid=\"4242\",rank=\"3\"}"), "2");
  EXPECT_EQ(std::stod(s.at("gpushim_start_time_seconds{host=\"node7\",pid=\"4242\",rank=\"3\"}")), 1718000000.25);
}

TEST(PrometheusText, FamiliesWithoutSamplesAreLeftOut) {
  ProcessMetrics m = TwoDevices();
  m.devices[1].unaccounted_bytes.reset();
  m.devices[1].capacity_bytes = 0;
  m.devices[0].capacity_bytes = 0;
  const std::string text = to_prometheus_text(m);
  EXPECT_EQ(text.find("gpushim_unaccounted_bytes"), std::string::npos);
  EXPECT_EQ(text.find("gpushim_capacity_bytes"), std::string::npos);
  EXPECT_NE(text.find("gpushim_cap_bytes{"), std::string::npos);  // device 0 still has its limit

  ProcessMetrics none = TwoDevices();
  none.devices.clear();
  none.running = false;
  const std::string idle = to_prometheus_text(none);
  EXPECT_EQ(idle.find("gpushim_allocated_bytes"), std::string::npos);
  EXPECT_NE(idle.find("gpushim_running{host=\"node7\",pid=\"4242\",rank=\"3\"} 0\n"), std::string::npos);
}

TEST(PrometheusText, LabelValuesAreEscapedAndAlwaysUtf8) {
  ProcessMetrics m = TwoDevices();
  m.id.exe_name = "we\"ird\\name\nx\xff\xc3\xa9";
  m.id.rank = "";
  const std::string text = to_prometheus_text(m);
  EXPECT_NE(text.find("exe=\"we\\\"ird\\\\name\\nx\xEF\xBF\xBD\xc3\xa9\""), std::string::npos) << text;
  EXPECT_NE(text.find("rank=\"\""), std::string::npos);
  // No raw newline inside a sample line: every line is a comment or starts with gpushim_.
  for (const std::string& l : Lines(text)) EXPECT_TRUE(l[0] == '#' || l.rfind("gpushim_", 0) == 0) << l;
}

TEST(PrometheusText, CapIsTheCapacityWhenTheLimitIsAboveIt) {
  DeviceMetrics d;
  d.capacity_bytes = 100;
  d.limit_bytes = 1000;
  EXPECT_EQ(d.cap_bytes(), 100u);
  d.capacity_bytes = 0;
  EXPECT_EQ(d.cap_bytes(), 1000u);
  d.limit_bytes = 0;
  EXPECT_EQ(d.cap_bytes(), 0u);
}

}  // namespace
}  // namespace gpushim
