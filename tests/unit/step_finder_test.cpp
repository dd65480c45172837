// The program's own step inside a repeating allocation pattern (report/step_finder.h), and growth
// per step on it (report/growth_verdict.h): shapes that cycle every 8 steps with a shape-dependent
// number of temporaries must not turn 40 steps into "5 iterations, 8 needed".
#include "report/step_finder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "report/growth_verdict.h"
#include "test_sizes.h"

namespace gpushim {
namespace {


FrameInfo py(const char* function, int line) {
  FrameInfo f;
  f.function = function;
  f.file = "/home/me/train.py";
  f.line = line;
  f.python = true;
  return f;
}

FrameInfo lib(const char* function) {
  FrameInfo f;
  f.function = function;
  f.module = "/usr/lib/x86_64-linux-gnu/libffi.so.8";
  f.address = 0x10;
  return f;
}

// Stacks by id: every allocation goes through the same helper line (`alloc`), called from a line
// of train_step (or of main, for the model load).
struct Program {
  std::map<uint32_t, std::vector<FrameInfo>> stacks;
  Program() {
    auto in_step = [](int line) {
      return std::vector<FrameInfo>{lib("ffi_call"), py("alloc", 5), py("train_step", line), py("main", 30),
                                    py("<module>", 40)};
    };
    stacks[1] = in_step(10);  // activations
    stacks[2] = in_step(11);  // temporaries: as many as the shape asks for
    stacks[3] = in_step(12);  // the leak
    stacks[4] = {lib("ffi_call"), py("alloc", 5), py("load_model", 20), py("main", 29), py("<module>", 40)};
    stacks[5] = {lib("ffi_call"), lib("start_thread")};  // another thread's, no user frame
  }
  StackFramesOf frames() const {
    return [this](uint32_t s) { return stacks.at(s); };
  }
};

// Feeds `steps` steps to the detector; returns the allocation count after each step.
std::vector<uint64_t> run_steps(PeriodDetector* d, int steps, bool warmup = true, bool backward = false) {
  if (warmup)
    for (int i = 0; i < 4; ++i) d->on_allocation(4);
  std::vector<uint64_t> after;
  for (int s = 0; s < steps; ++s) {
    // With `backward`, another thread (autograd's, say) allocates beside each of them.
    auto alloc = [&](uint32_t site) {
      d->on_allocation(site);
      if (backward) d->on_allocation(5);
    };
    alloc(1);
    for (int t = 0; t <= s % 8; ++t) alloc(2);
    alloc(3);
    after.push_back(d->allocations());
  }
  return after;
}

TEST(StepFinder, EightShapeCycleIsEightSteps) {
  Program prog;
  auto d = std::make_unique<PeriodDetector>();
  const std::vector<uint64_t> after = run_steps(d.get(), 40);
  const DetectedPeriod period = d->detect();
  ASSERT_EQ(period.period, 8u * 2 + 36);  // 8 steps: two fixed allocations each, 1+2+...+8 temporaries
  EXPECT_EQ(period.iterations, 5u);
  const DetectedSteps steps = find_steps(period, prog.frames());
  EXPECT_EQ(steps.per_pattern, 8u);
  EXPECT_EQ(steps.steps, 40u);
  EXPECT_EQ(steps.function, "train_step");
  EXPECT_EQ(steps.step_at(after[9]), 10u);
  EXPECT_EQ(steps.step_at(after.back()), 40u);
  EXPECT_EQ(steps.step_at(2), 0u);  // the model load
}

TEST(StepFinder, AllocationsWithoutUserFramesDoNotHideTheStep) {
  Program prog;
  auto d = std::make_unique<PeriodDetector>();
  run_steps(d.get(), 40, true, true);
  const DetectedPeriod period = d->detect();
  EXPECT_EQ(period.period, 104u);
  const DetectedSteps steps = find_steps(period, prog.frames());
  EXPECT_EQ(steps.per_pattern, 8u);
  EXPECT_EQ(steps.steps, 40u);
}

TEST(StepFinder, AStepAtOnePlaceIsThePattern) {
  std::map<uint32_t, std::vector<FrameInfo>> stacks = {
      {1, {py("alloc", 5), py("train_step", 10), py("main", 30)}}};
  auto d = std::make_unique<PeriodDetector>();
  for (int i = 0; i < 30; ++i) d->on_allocation(1);
  const DetectedPeriod period = d->detect();
  ASSERT_EQ(period.period, 1u);
  EXPECT_EQ(find_steps(period, [&](uint32_t s) { return stacks.at(s); }).per_pattern, 0u);
}

TEST(StepFinder, GrowthIsJudgedPerStepAfterFortySteps) {
  Program prog;
  auto d = std::make_unique<PeriodDetector>();
  const std::vector<uint64_t> after = run_steps(d.get(), 40);
  // The leak's site keeps 2.4 MiB a step; checkpoints every 3 steps.
  SiteSeries leak{SiteKey{3, 0, MemoryKind::kDevice}, {}};
  const uint64_t per_step = 12 * MiB / 5;
  for (size_t s = 2; s < after.size(); s += 3) {
    SitePoint p{};
    p.t_ns = (s + 1) * 1000000;
    p.bytes = (s + 1) * per_step;
    p.count = s + 1;
    p.instant = s + 1;
    p.allocs = after[s];
    leak.points.push_back(p);
  }
  GrowthEvidence ev;
  ev.samples = leak.points.size();
  ev.detected = d->detect();
  const GrowthReport g = judge_growth({leak}, ev, [&](const SiteKey& k) { return prog.stacks.at(k.stack); });
  EXPECT_EQ(g.verdict, "suspects") << g.evidence;
  EXPECT_EQ(g.evidence, "40 steps detected (the allocation pattern repeats every 8 steps), 8 needed");
  EXPECT_EQ(g.iterations, 40u);
  EXPECT_EQ(g.steps_per_pattern, 8u);
  ASSERT_EQ(g.suspects.size(), 1u);
  EXPECT_NEAR(g.suspects[0].bytes_per_iteration, static_cast<double>(per_step), 0.02 * static_cast<double>(per_step));
}

TEST(StepFinder, TooFewStepsSaysHowManyMore) {
  Program prog;
  auto d = std::make_unique<PeriodDetector>();
  // 3 steps of a pattern of one step each: the period is found, 3 steps are too few.
  for (int s = 0; s < 3; ++s) d->on_allocation(1), d->on_allocation(2), d->on_allocation(3);
  GrowthEvidence ev;
  ev.samples = 20;
  ev.detected = d->detect();
  ASSERT_EQ(ev.detected.period, 3u);
  const GrowthReport g = judge_growth({}, ev, [&](const SiteKey& k) { return prog.stacks.at(k.stack); });
  EXPECT_EQ(g.verdict, "not judged");
  EXPECT_EQ(g.evidence, "3 steps detected, 8 needed: 5 more steps");
}

}  // namespace
}  // namespace gpushim
