// The run's recorder (recorder/run_recorder.h): what it keeps of a run beyond the books reaches
// the report as it was recorded, read from the books and the device table the core lends it.
#include "recorder/run_recorder.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <utility>

#include "test_sizes.h"

namespace gpushim {
namespace {

// What the Shim lends the recorder, with one device and no pool: forwarded records only.
struct RecordedRun {
  RecordedRun() : ledger(0, ledgers.records()), capturer(StackCaptureOptions{0, false, "", 0, 0}, &stacks, &iterations) {
    ledgers.add(&ledger);
    config.stack_depth = 0;
    config.report_enabled = false;
    config.summary_sites = 0;
    RunRecorder::Lent lent;
    lent.config = &config;
    lent.exe = "/bin/run_recorder_test";
    lent.pid = 4242;
    lent.start_ns = now_ns();
    lent.books = &ledgers;
    lent.stacks = &stacks;
    lent.capturer = &capturer;
    lent.modules = &modules;
    lent.usage = &usage;
    lent.vmm = &vmm;
    lent.iterations = &iterations;
    lent.devices = [this](absl::FunctionRef<void(const RunRecorder::DeviceView&)> fn) {
      fn(RunRecorder::DeviceView{0, &ledger, 16 * 1024 * MiB});
    };
    lent.host_bytes = [] { return uint64_t{0}; };
    recorder = std::make_unique<RunRecorder>(std::move(lent));
  }
  // A distinct interned stack per `n`, so that sites and their order can be told apart.
  StackId stack(uint64_t n) {
    const uint64_t words[] = {0x1000 + n};
    return stacks.intern(words, 1);
  }
  AllocationRecord record(uint64_t size, StackId at) {
    return AllocationRecord{size, size, 1, at, 0, MemoryKind::kDevice, Route::kForwarded, kUnknownModule};
  }
  void allocate(uintptr_t ptr, uint64_t size, StackId at) {
    ASSERT_TRUE(ledgers.commit(ptr, record(size, at)));
    recorder->after_event(now_ns());
  }
  OomRecord oom(uint64_t requested) {
    OomRecord r{};
    r.t_ns = 1;
    r.device = 0;
    r.requested = requested;
    r.stack = stack(99);
    r.allocated = ledger.counters().live_bytes();
    return r;
  }

  Config config;
  Ledgers ledgers;
  DeviceLedger ledger;
  StackTable stacks;
  IterationCounter iterations;
  StackCapturer capturer;
  ModuleMap modules;
  DriverUsage usage;
  VmmTracker vmm;
  std::unique_ptr<RunRecorder> recorder;
};

TEST(RunRecorder, KeepsTheFirstOomsWithTheLargestSitesOfThatMoment) {
  RecordedRun run;
  const StackId small = run.stack(1), large = run.stack(2);
  run.allocate(0x10000, 1 * MiB, small);
  run.allocate(0x20000, 8 * MiB, large);
  for (int i = 0; i < 20; ++i) run.recorder->oom(run.oom((i + 1) * MiB), /*limit=*/0);
  const ReportData r = run.recorder->build_report("snapshot");
  ASSERT_EQ(r.ooms.size(), 16u);  // the first 16; the rest are counted, not kept
  EXPECT_EQ(r.ooms.front().requested, 1 * MiB);
  EXPECT_EQ(r.ooms.back().requested, 16 * MiB);
  ASSERT_EQ(r.ooms.front().top_sites.size(), 2u);
  EXPECT_EQ(r.ooms.front().top_sites[0].live_bytes, 8 * MiB);  // largest first
  EXPECT_EQ(r.ooms.front().top_sites[0].stack_id, large);
  EXPECT_EQ(r.ooms.front().top_sites[1].live_bytes, 1 * MiB);
  EXPECT_EQ(r.ooms.front().allocated, 9 * MiB);
}

TEST(RunRecorder, AddsUpWhatResetsFreedPerSiteAndCountsResetsPerDevice) {
  RecordedRun run;
  const StackId a = run.stack(1), b = run.stack(2);
  run.recorder->freed_by_reset(0x10000, run.record(2 * MiB, a));
  run.recorder->freed_by_reset(0x20000, run.record(3 * MiB, a));
  run.recorder->freed_by_reset(0x30000, run.record(4 * MiB, b));
  run.recorder->device_reset(0);
  run.recorder->device_reset(0);
  run.recorder->context_destroyed(0);
  const ReportData r = run.recorder->build_report("snapshot");
  ASSERT_EQ(r.freed_by_reset.size(), 2u);
  EXPECT_EQ(r.freed_by_reset[0].stack_id, a);  // 5 MiB in two allocations: largest first
  EXPECT_EQ(r.freed_by_reset[0].live_bytes, 5 * MiB);
  EXPECT_EQ(r.freed_by_reset[0].live_count, 2u);
  EXPECT_EQ(r.freed_by_reset[1].live_bytes, 4 * MiB);
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].resets, 2u);
  EXPECT_EQ(r.devices[0].context_destroys, 1u);
}

TEST(RunRecorder, ReportsTheLentDevicesFiguresAndTheRunItRecords) {
  RecordedRun run;
  run.allocate(0x10000, 3 * MiB, run.stack(1));
  const ReportData r = run.recorder->build_report("snapshot");
  EXPECT_EQ(r.reason, "snapshot");
  EXPECT_EQ(r.pid, 4242);
  EXPECT_EQ(r.exe, "/bin/run_recorder_test");
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].live_bytes, 3 * MiB);
  EXPECT_EQ(r.devices[0].capacity_bytes, 16 * 1024 * MiB);
  ASSERT_EQ(r.sites.size(), 1u);
  EXPECT_EQ(r.sites[0].live_bytes, 3 * MiB);
  // The metrics file's figures are the same five, taken from the same ledger.
  const std::vector<DeviceMetrics> m = run.recorder->live_device_metrics();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].live_bytes, 3 * MiB);
  EXPECT_EQ(m[0].live_count, 1u);
  EXPECT_EQ(m[0].total_allocs, 1u);
  EXPECT_FALSE(m[0].unaccounted_bytes.has_value());  // no driver sample was taken
}

}  // namespace
}  // namespace gpushim
