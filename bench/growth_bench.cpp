// Cost of growth tracking (docs/benchmarks.md, "Growth tracking"): what one sampling instant costs
// the allocating thread that takes it (every GPUSHIM_SAMPLE_MS), as a function of the number of
// live sites, and what the detector costs at report time. Nothing is paid per allocation.
#include <benchmark/benchmark.h>

#include "accounting/allocation_tracker.h"
#include "accounting/checkpoint_schedule.h"
#include "accounting/period_detector.h"
#include "accounting/growth_detector.h"
#include "accounting/site_history.h"

namespace gpushim {
namespace {

// A tracker holding `sites` live sites of 4 allocations each.
void fill(AllocationTracker* tracker, int64_t sites) {
  uintptr_t p = 0x100000;
  for (int64_t s = 0; s < sites; ++s)
    for (int i = 0; i < 4; ++i) {
      AllocationRecord rec;
      rec.size = 1 << 20;
      rec.stack = static_cast<StackId>(s + 1);
      tracker->insert(p, rec);
      p += 1 << 20;
    }
}

// One sampling instant: the tracker's per-site totals merged across shards, appended to the history.
void BM_SampleInstant(benchmark::State& state) {
  AllocationTracker tracker;
  fill(&tracker, state.range(0));
  SiteHistory history;
  uint64_t t = 0;
  for (auto _ : state) history.sample(++t, 0, tracker.sites());
  state.counters["sites"] = static_cast<double>(state.range(0));
  state.counters["history_bytes"] = static_cast<double>(history.memory_bytes());
}
BENCHMARK(BM_SampleInstant)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

// The logical-time checkpoints' cost on every allocation and free (accounting/checkpoint_schedule.h):
// one relaxed atomic add and a compare, shared by all allocating threads.
void BM_CheckpointPerEvent(benchmark::State& state) {
  static CheckpointSchedule schedule;
  for (auto _ : state) benchmark::DoNotOptimize(schedule.on_event());
}
BENCHMARK(BM_CheckpointPerEvent)->Threads(1)->Threads(2);

// Per event over a whole run of 1M events with `sites` live sites, the instants the checkpoints
// take included (about 16 * log2(events / 16) of them).
void BM_CheckpointsAmortized(benchmark::State& state) {
  AllocationTracker tracker;
  fill(&tracker, state.range(0));
  constexpr int64_t kEvents = 1000000;
  uint64_t instants = 0;
  for (auto _ : state) {
    CheckpointSchedule schedule;
    SiteHistory history;
    for (int64_t e = 0; e < kEvents; ++e)
      if (schedule.on_event()) history.sample(static_cast<uint64_t>(e), 0, tracker.sites());
    instants = history.samples();
  }
  state.SetItemsProcessed(state.iterations() * kEvents);
  state.counters["instants"] = static_cast<double>(instants);
}
BENCHMARK(BM_CheckpointsAmortized)->Arg(10)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond);

// The iteration detector's cost on every allocation (accounting/period_detector.h): the site into a
// ring, one relaxed atomic add and a store.
void BM_PeriodDetectorPerAllocation(benchmark::State& state) {
  static PeriodDetector detector;
  uint32_t site = 0;
  for (auto _ : state) detector.on_allocation(++site % 37);
}
BENCHMARK(BM_PeriodDetectorPerAllocation)->Threads(1)->Threads(2);

// Searching the full ring for the period when a report is written (a loop of `period` sites).
void BM_PeriodDetectorAtReport(benchmark::State& state) {
  PeriodDetector detector;
  for (uint64_t i = 0; i < 3 * PeriodDetector::kRing; ++i) detector.on_allocation(static_cast<uint32_t>(i % state.range(0)));
  DetectedPeriod found;
  for (auto _ : state) benchmark::DoNotOptimize(found = detector.detect());
  state.counters["period"] = static_cast<double>(found.period);
}
BENCHMARK(BM_PeriodDetectorAtReport)->Arg(2)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);

// The detector over a full history (2048 sites of 65 points, the most the shim keeps).
void BM_DetectGrowth(benchmark::State& state) {
  std::vector<std::vector<SitePoint>> series(static_cast<size_t>(state.range(0)));
  for (size_t s = 0; s < series.size(); ++s)
    for (uint64_t i = 0; i < 65; ++i) series[s].push_back(SitePoint{i, (s % 2 ? i : 1) << 20, i, i});
  size_t found = 0;
  for (auto _ : state) {
    found = detect_growth(series).size();
    benchmark::DoNotOptimize(found);
  }
  state.counters["suspects"] = static_cast<double>(found);
}
BENCHMARK(BM_DetectGrowth)->Arg(2048)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpushim

BENCHMARK_MAIN();
