// A trace's live figures at the moment the interpreter's teardown began (format 1.5), as a report's.
#include <gtest/gtest.h>

#include "run_view.h"
#include "test_sizes.h"

namespace gpushim::analysis {
namespace {

trace::TraceEvent teardown_event(trace::EventKind kind, uint64_t t_ns, uint64_t addr, uint64_t size, int device) {
  trace::TraceEvent e;
  e.kind = kind;
  e.t_ns = t_ns;
  e.addr = addr;
  e.size = e.requested = size;
  e.device = static_cast<int16_t>(device);
  e.stack = 7;
  return e;
}

TEST(TeardownView, LiveFiguresAreThoseOfTheTeardownsStartOnEveryDevice) {
  using trace::EventKind;
  TraceData t;
  t.header.start_mono_ns = 1000;
  t.devices = {trace::DeviceInfo{0, 16 * GiB, 0}};
  t.events = {teardown_event(EventKind::kAlloc, 2000, 0x1000, 4 * MiB, 0),
              teardown_event(EventKind::kAlloc, 2100, 0x900000, 2 * MiB, 0),
              teardown_event(EventKind::kFree, 2200, 0x900000, 2 * MiB, 0),
              // the teardown begins at 3000: what follows is its doing
              teardown_event(EventKind::kFree, 3500, 0x1000, 4 * MiB, 0),
              teardown_event(EventKind::kAlloc, 3600, 0x7000000, 1 * MiB, 1)};  // a device first used then
  trace::EndInfo end;
  end.end_mono_ns = 4000;
  end.teardown_mono_ns = 3000;
  t.end = end;
  RunView v;
  run_from_trace(t, "t.trace", &v);
  ASSERT_TRUE(v.meta.teardown.observed);
  EXPECT_DOUBLE_EQ(v.meta.teardown.began_s, 2e-6);
  EXPECT_EQ(v.meta.teardown.freed_bytes, 4 * MiB);
  EXPECT_EQ(v.meta.teardown.freed_count, 1u);
  ASSERT_EQ(v.meta.devices.size(), 2u);
  EXPECT_EQ(v.meta.devices[0].live_bytes, 4 * MiB);
  EXPECT_EQ(v.meta.devices[0].live_count, 1u);
  EXPECT_EQ(v.meta.devices[0].total_frees, 2u);  // the frees count to the end, as in a report
  EXPECT_EQ(v.meta.devices[1].live_bytes, 0u);  // it held nothing when the teardown began
  // Without the moment (a trace before 1.5), live figures are of the end.
  t.end->teardown_mono_ns = 0;
  RunView at_end;
  run_from_trace(t, "t.trace", &at_end);
  EXPECT_FALSE(at_end.meta.teardown.observed);
  EXPECT_EQ(at_end.meta.devices[0].live_bytes, 0u);
  EXPECT_EQ(at_end.meta.devices[1].live_bytes, 1 * MiB);
}

}  // namespace
}  // namespace gpushim::analysis
