// GPUSHIM_METRICS and GPUSHIM_SNAPSHOT_SIGNAL.
#include <gtest/gtest.h>

#include <csignal>

#include "config/config.h"

namespace gpushim {
namespace {

ConfigResult Parse(const char* name, const char* value) { return parse_config({{name, value}}); }

TEST(LiveConfig, DefaultsMetricsOffSnapshotsOnUsr2) {
  const ConfigResult r = parse_config(std::vector<std::pair<std::string, std::string>>{});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.config.metrics_template.empty());
  EXPECT_EQ(r.config.snapshot_signal, SIGUSR2);
}

TEST(LiveConfig, MetricsTemplate) {
  EXPECT_EQ(Parse("GPUSHIM_METRICS", "/var/lib/prom/gpushim.%h.%p.prom").config.metrics_template,
            "/var/lib/prom/gpushim.%h.%p.prom");
  EXPECT_EQ(Parse("GPUSHIM_METRICS", "textfile/").config.metrics_template, "textfile/");
  EXPECT_TRUE(Parse("GPUSHIM_METRICS", "off").config.metrics_template.empty());
  EXPECT_TRUE(Parse("GPUSHIM_METRICS", "OFF").config.metrics_template.empty());
  EXPECT_TRUE(Parse("GPUSHIM_METRICS", "0").config.metrics_template.empty());
  const ConfigResult empty = Parse("GPUSHIM_METRICS", " ");
  ASSERT_EQ(empty.errors.size(), 1u);
  EXPECT_NE(empty.errors[0].message().find("path template"), std::string::npos);
}

TEST(LiveConfig, SnapshotSignalNames) {
  EXPECT_EQ(Parse("GPUSHIM_SNAPSHOT_SIGNAL", "USR1").config.snapshot_signal, SIGUSR1);
  EXPECT_EQ(Parse("GPUSHIM_SNAPSHOT_SIGNAL", "sigusr1").config.snapshot_signal, SIGUSR1);
  EXPECT_EQ(Parse("GPUSHIM_SNAPSHOT_SIGNAL", " usr2 ").config.snapshot_signal, SIGUSR2);
  EXPECT_EQ(Parse("GPUSHIM_SNAPSHOT_SIGNAL", "SIGUSR2").config.snapshot_signal, SIGUSR2);
  EXPECT_EQ(Parse("GPUSHIM_SNAPSHOT_SIGNAL", "off").config.snapshot_signal, 0);
  EXPECT_EQ(Parse("GPUSHIM_SNAPSHOT_SIGNAL", "0").config.snapshot_signal, 0);
  for (const char* bad : {"", "HUP", "SIGTERM", "12", "SIGOFF", "USR3", "SIG"}) {
    const ConfigResult r = Parse("GPUSHIM_SNAPSHOT_SIGNAL", bad);
    ASSERT_EQ(r.errors.size(), 1u) << "'" << bad << "'";
    EXPECT_NE(r.errors[0].message().find("USR2"), std::string::npos);
  }
}

}  // namespace
}  // namespace gpushim
