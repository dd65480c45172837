// The replay's GPU-time model: SimBackend's clock and completion model, the backlog estimate, and
// a replay whose answer depends on when the device finishes.
#include <gtest/gtest.h>

#include "gpu_time.h"
#include "policy/sim_backend.h"
#include "replay.h"
#include "test_sizes.h"

namespace gpushim::analysis {
namespace {

constexpr uint64_t kMs = 1'000'000;

TEST(GpuTime, ModelledEventsCompleteWhenTheClockReachesTheirBacklog) {
  SimBackend sim(1ull << 30);
  sim.model_completion([](uint64_t r) { return r + 5 * kMs; });
  sim.set_clock(10 * kMs);
  const uint64_t e = sim.record_event(nullptr);
  EXPECT_FALSE(sim.event_done(e));
  sim.set_clock(14 * kMs);
  EXPECT_FALSE(sim.event_done(e));
  sim.set_clock(15 * kMs);
  EXPECT_TRUE(sim.event_done(e));
  // A wait for a fence finishes everything queued before it, not what came after.
  const uint64_t early = sim.record_event(nullptr);
  sim.set_clock(16 * kMs);
  const uint64_t fence = sim.record_device_fence();
  sim.set_clock(17 * kMs);
  const uint64_t late = sim.record_event(nullptr);
  EXPECT_TRUE(sim.wait_fence(fence));
  EXPECT_TRUE(sim.event_done(early));
  EXPECT_FALSE(sim.event_done(late));
  EXPECT_EQ(sim.synchronize(), CUDA_SUCCESS);
  EXPECT_TRUE(sim.event_done(late));
}

TEST(GpuTime, EstimateTakesTheBacklogMostIntervalsHoldAndKeepsInsideTheRunsBounds) {
  std::vector<SimBackend::CompletionSample> s;
  // Ten seen pending after 1 ms and complete by 3 ms: the backlog is between them.
  for (uint64_t i = 0; i < 10; ++i) s.push_back({false, i * 100 * kMs, i * 100 * kMs + 1 * kMs, i * 100 * kMs + 3 * kMs});
  // One seen complete at once, at 2 s: work queued just before it is done by then too.
  s.push_back({true, 2000 * kMs, 0, 2000 * kMs});
  const DeviceLag lag = DeviceLag::estimate(s, DeviceLag::fixed(50 * kMs, "fallback"));
  EXPECT_GT(lag.backlog_ns(), 1 * kMs);
  EXPECT_LE(lag.backlog_ns(), 3 * kMs);
  EXPECT_EQ(lag.samples(), s.size());
  EXPECT_EQ(lag.completes_at(500 * kMs), 500 * kMs + lag.backlog_ns());
  EXPECT_EQ(lag.completes_at(2000 * kMs - 100), 2000 * kMs);  // bounded by the later completion seen
  EXPECT_GT(lag.completes_at(900 * kMs), 901 * kMs);          // not before the "not yet" seen
  const DeviceLag none = DeviceLag::estimate({}, DeviceLag::fixed(50 * kMs, "fallback"));
  EXPECT_EQ(none.backlog_ns(), 50 * kMs);
  EXPECT_EQ(none.source(), "fallback");
}

TraceEvent gt_ev(EventKind kind, uint64_t t, uint64_t addr, uint64_t size) {
  TraceEvent e;
  e.kind = kind;
  e.t_ns = t;
  e.addr = addr;
  e.size = e.requested = size;
  return e;
}

// cudaFree of A, then an allocation of A's size 1 ms later: reusable at once on an instant device;
// with a 10 ms backlog the caching pool must wait for the fence of A's free.
TEST(GpuTime, ReplayUnderTheModelWaitsForTheDevice) {
  TraceData t;
  t.header.policy = "caching";
  t.devices.push_back(trace::DeviceInfo{0, 1ull << 30, 0});
  t.events = {gt_ev(EventKind::kAlloc, 1 * kMs, 0xA000000, 100 * kMiB), gt_ev(EventKind::kFree, 2 * kMs, 0xA000000, 100 * kMiB),
              gt_ev(EventKind::kAlloc, 3 * kMs, 0xB000000, 100 * kMiB), gt_ev(EventKind::kFree, 4 * kMs, 0xB000000, 100 * kMiB)};
  ReplaySettings s;
  s.config.policy = PolicyKind::kCaching;
  s.gpu_time = GpuTime::kInstant;
  s.follow_recorded_reuse = false;
  const ReplayResult instant = replay_trace(t, s);
  ASSERT_EQ(instant.devices.size(), 1u);
  EXPECT_EQ(instant.devices[0].driver.fence_waits, 0u);
  s.gpu_time = GpuTime::kModel;
  s.lags = std::make_shared<const std::map<int, DeviceLag>>(
      std::map<int, DeviceLag>{{0, DeviceLag::fixed(10 * kMs, "test")}});
  const ReplayResult model = replay_trace(t, s);
  ASSERT_EQ(model.devices.size(), 1u);
  EXPECT_EQ(model.gpu_time, GpuTime::kModel);
  EXPECT_EQ(model.devices[0].backlog_ns, 10 * kMs);
  EXPECT_EQ(model.devices[0].driver.fence_waits, 1u);
  EXPECT_EQ(model.devices[0].peak_reserved, instant.devices[0].peak_reserved);
  // Without samples the estimate falls back to a fraction of the median step.
  t.events.insert(t.events.begin(), gt_ev(EventKind::kIteration, 0, 0, 0));
  t.events.push_back(gt_ev(EventKind::kIteration, 100 * kMs, 0, 0));
  const auto lags = estimate_device_lag(t, s.config);
  ASSERT_EQ(lags.count(0), 1u);
  EXPECT_EQ(lags.at(0).backlog_ns(), static_cast<uint64_t>(kTypicalBacklogStepFraction * 100 * kMs));
}

// A trace whose reuse moments name an event this build's pool never records: the calibration
// replay has departed from the run, and says so instead of trusting what follows.
TEST(GpuTime, CalibrationStopsWhereTheReplayDepartsFromTheRun) {
  TraceData t;
  t.header.policy = "caching";
  t.devices.push_back(trace::DeviceInfo{0, 1ull << 30, 0});
  TraceEvent reuse = gt_ev(EventKind::kReuse, 2 * kMs, 0, 3);
  reuse.requested = static_cast<uint64_t>(trace::ReuseMoment::kEventDone);
  t.events = {gt_ev(EventKind::kAlloc, 1 * kMs, 0xA000000, 1 * kMiB), reuse, gt_ev(EventKind::kFree, 2 * kMs, 0xA000000, 1 * kMiB),
              gt_ev(EventKind::kAlloc, 3 * kMs, 0xB000000, 1 * kMiB)};
  Config c;
  c.policy = PolicyKind::kCaching;
  const auto lags = estimate_device_lag(t, c);
  ASSERT_EQ(lags.count(0), 1u);
  EXPECT_NE(lags.at(0).source().find("departed from the run at 0.002 s"), std::string::npos) << lags.at(0).source();
  EXPECT_EQ(lags.at(0).samples(), 0u);
}

}  // namespace
}  // namespace gpushim::analysis
