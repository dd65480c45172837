#include "report/growth_verdict.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "accounting/growth_detector.h"
#include "util/iteration_counter.h"
#include "accounting/memory_kind.h"
#include "report/step_finder.h"
#include "stacks/frame_roles.h"
#include "stacks/stack_table.h"
#include "stacks/site_identity.h"
#include "util/text.h"

namespace gpushim {

namespace {

struct Merged {
  SiteKey key;  // the member with the smallest stack id: the same one whichever side merges
  std::vector<FrameInfo> frames;
  std::vector<SitePoint> points;
};

// The site's own series: at each checkpoint, the sum over its stacks. A stack's series exists only
// while it had live memory at every checkpoint since its first (site history drops a stack that
// ran empty), so before its first point it adds nothing; and site history keeps the checkpoints
// that are multiples of a track's stride, so a checkpoint one stack kept is kept by every other
// stack of the site alive then unless that one thinned it out. Such a checkpoint is left out: a
// stale value there would bend the slope. The last checkpoint is every stack's.
std::vector<SitePoint> sum_series(const std::vector<const SiteSeries*>& members) {
  std::vector<SitePoint> out;
  for (const SiteSeries* m : members) out.insert(out.end(), m->points.begin(), m->points.end());
  std::sort(out.begin(), out.end(), [](const SitePoint& a, const SitePoint& b) { return a.t_ns < b.t_ns; });
  out.erase(std::unique(out.begin(), out.end(), [](const SitePoint& a, const SitePoint& b) { return a.t_ns == b.t_ns; }),
            out.end());
  size_t kept = 0;
  for (SitePoint p : out) {
    p.bytes = p.count = 0;
    bool exact = true;
    for (const SiteSeries* m : members) {
      if (m->points.empty() || m->points.front().t_ns > p.t_ns) continue;
      auto at = std::lower_bound(m->points.begin(), m->points.end(), p.t_ns,
                                 [](const SitePoint& q, uint64_t t) { return q.t_ns < t; });
      if (at == m->points.end() || at->t_ns != p.t_ns) {
        exact = false;
        break;
      }
      p.bytes += at->bytes;
      p.count += at->count;
    }
    if (exact) out[kept++] = p;
  }
  out.resize(kept);
  return out;
}

std::vector<Merged> merge_by_identity(const std::vector<SiteSeries>& series, const SiteFrames& frames_of) {
  std::vector<Merged> merged;
  std::vector<std::vector<const SiteSeries*>> members;
  absl::flat_hash_map<std::string, size_t> by_identity;
  // In stack-id order, so that the representative and the order of the merged series do not
  // depend on the order the history's map hands them out.
  std::vector<const SiteSeries*> order;
  for (const SiteSeries& s : series) order.push_back(&s);
  std::sort(order.begin(), order.end(), [](const SiteSeries* a, const SiteSeries* b) {
    if (a->key.stack != b->key.stack) return a->key.stack < b->key.stack;
    if (a->key.device != b->key.device) return a->key.device < b->key.device;
    return static_cast<int>(a->key.kind) < static_cast<int>(b->key.kind);
  });
  for (const SiteSeries* s : order) {
    std::vector<FrameInfo> frames = frames_of(s->key);
    auto [it, fresh] = by_identity.emplace(site_identity(s->key.device, memory_kind_name(s->key.kind), frames), merged.size());
    if (fresh) {
      merged.push_back(Merged{s->key, std::move(frames), {}});
      members.emplace_back();
    }
    members[it->second].push_back(s);
  }
  for (size_t i = 0; i < merged.size(); ++i)
    merged[i].points = members[i].size() == 1 ? members[i][0]->points : sum_series(members[i]);
  return merged;
}

// Without iterations (none counted, no loop found in the allocations), the checkpoints are the
// only clock, and a site filled in a loop that did nothing else (weights loaded one by one; a run
// that ended during its load, out of memory) rises at every checkpoint as a leak would. A leak
// grows while the program's other work comes and goes: between one rise of the site and its next,
// the process must also have allocated elsewhere (or the site freed some of its own), at least
// `needed` times. (Between consecutive rises, not consecutive checkpoints: early checkpoints come
// at every call, so a leaking step's rise is a checkpoint of its own, its scratch in the others.)
// Points that do not know the allocations made (allocs 0) cannot tell.
bool grew_beside_other_work(const std::vector<SitePoint>& p, size_t needed) {
  if (std::all_of(p.begin(), p.end(), [](const SitePoint& q) { return q.allocs == 0; })) return true;
  size_t beside = 0;
  size_t last_rise = 0;  // 0: none yet (a rise is at a point after the first)
  for (size_t i = 1; i < p.size(); ++i) {
    if (p[i].bytes <= p[i - 1].bytes) continue;
    if (last_rise != 0 && p[i].allocs >= p[last_rise].allocs) {
      const int64_t made = static_cast<int64_t>(p[i].allocs - p[last_rise].allocs);
      const int64_t kept = static_cast<int64_t>(p[i].count) - static_cast<int64_t>(p[last_rise].count);
      if (made > kept) ++beside;
    }
    last_rise = i;
  }
  return beside >= needed;
}

}  // namespace

const char* growth_unit(uint64_t steps_per_pattern) { return steps_per_pattern ? "step" : "iteration"; }

GrowthReport judge_growth(const std::vector<SiteSeries>& series, const GrowthEvidence& evidence,
                          const SiteFrames& frames_of) {
  GrowthReport g;
  g.samples = evidence.samples;
  g.iterations = evidence.iterations;
  g.iteration_source = IterationCounter::source_name(evidence.iteration_sources);
  const DetectedPeriod& detected = g.iterations == 0 ? evidence.detected : DetectedPeriod::none();
  DetectedSteps steps;
  if (detected.period != 0) {
    g.iterations = detected.iterations;
    g.iteration_source = "detected";
    g.detected_period = detected.period;
    // The program's own step inside the pattern, from the same stacks on both sides.
    steps = find_steps(detected, [&](uint32_t stack) { return frames_of(SiteKey{stack, 0, MemoryKind::kDevice}); });
    if (steps.per_pattern != 0) {
      g.iterations = steps.steps;
      g.steps_per_pattern = steps.per_pattern;
      g.step_function = steps.function;
    }
  }

  // One series per site identity, merged before judging: stacks that symbolize alike (the same
  // Python line reached through different interpreter frames, e.g. while 3.11 specializes the
  // first calls) are one site to the reader, and a variant that holds a few of the site's
  // allocations must count in its live figures even though it does not grow on its own.
  std::vector<Merged> merged = merge_by_identity(series, frames_of);
  std::vector<std::vector<SitePoint>> points;
  points.reserve(merged.size());
  for (const Merged& m : merged) {
    points.push_back(m.points);
    // Detected steps are placed on the points by the allocations made before each checkpoint,
    // so that the slope is per step, whatever the sampling.
    if (steps.per_pattern != 0)
      for (SitePoint& p : points.back())
        if (p.allocs != 0) p.iteration = steps.step_at(p.allocs);
  }
  size_t set_aside = 0;  // sites that grew only while nothing else allocated (above)
  for (const GrowthFinding& f : detect_growth(points)) {
    // Through PyTorch's allocator, what reaches the shim of the program's other work depends on
    // PyTorch's cache (in charge, it serves every tensor but the segments): no allocation beside
    // a rise then proves nothing.
    const std::vector<FrameInfo>& frames = merged[f.series].frames;
    const bool through_torch = std::any_of(frames.begin(), frames.end(), torch_allocator_frame);
    if (g.iterations == 0 && !through_torch && !grew_beside_other_work(points[f.series], GrowthParams{}.min_increases)) {
      ++set_aside;
      continue;
    }
    Merged& m = merged[f.series];
    double per_iteration = f.has_iterations ? f.bytes_per_iteration : std::numeric_limits<double>::quiet_NaN();
    // Detected steps: the growth between the first and the last point over the steps between
    // them. Checkpoints crowd the run's start (logical time), where a shape cycle's first steps
    // would bend a least-squares slope; the end points are off by at most a partial cycle.
    if (steps.per_pattern != 0 && f.has_iterations) {
      const std::vector<SitePoint>& p = points[f.series];
      const SitePoint& first = p.front();
      const SitePoint& last = p.back();
      if (last.iteration > first.iteration)
        per_iteration = (static_cast<double>(last.bytes) - static_cast<double>(first.bytes)) /
                        static_cast<double>(last.iteration - first.iteration);
    }
    // Detected iterations not on the points: the growth over the loop's iterations.
    if (detected.period != 0 && g.iterations > 1 && !f.has_iterations)
      per_iteration = static_cast<double>(f.growth_bytes) / static_cast<double>(g.iterations - 1);
    GrowthSuspectReport s;
    s.device = m.key.device;
    s.kind = memory_kind_name(m.key.kind);
    s.growth_bytes = f.growth_bytes;
    s.bytes_per_s = f.bytes_per_s;
    s.bytes_per_iteration = per_iteration;
    s.iterations = f.has_iterations ? f.iterations : g.iterations;
    s.live_bytes = f.live_bytes;
    s.live_count = f.live_count;
    s.samples = f.samples;
    s.first_s = static_cast<double>(f.first_t_ns) / 1e9;
    s.last_s = static_cast<double>(f.last_t_ns) / 1e9;
    s.trend = f.trend;
    s.stack_id = m.key.stack;
    s.frames = std::move(m.frames);
    g.suspects.push_back(std::move(s));
  }
  // Ties (and merged suspects) in a fixed order, so that both sides list them alike.
  std::stable_sort(g.suspects.begin(), g.suspects.end(), [](const GrowthSuspectReport& a, const GrowthSuspectReport& b) {
    if (a.growth_bytes != b.growth_bytes) return a.growth_bytes > b.growth_bytes;
    return a.live_bytes > b.live_bytes;
  });
  // Counted iterations are the program's own clock: fewer than the detector needs points is too
  // little to call a site steady, whatever the checkpoints say. Without them, the checkpoints are.
  const uint64_t needed = GrowthParams{}.min_samples;
  const uint64_t seen = g.iterations ? g.iterations : g.samples;
  const std::string unit = g.iterations ? growth_unit(g.steps_per_pattern) : "checkpoint";
  g.evidence = plural(seen, unit) + (detected.period ? " detected" : " seen");
  if (g.steps_per_pattern > 1)
    g.evidence += " (the allocation pattern repeats every " + std::to_string(g.steps_per_pattern) + " steps)";
  g.evidence += ", " + std::to_string(needed) + " needed";
  if (seen < needed) {
    // A run too short says how much longer it must run.
    g.evidence += ": " + std::to_string(needed - seen) + " more " + unit + (needed - seen == 1 ? "" : "s");
    g.verdict = "not judged";
    g.suspects.clear();
  } else if (g.suspects.empty() && g.iterations == 0 && !series.empty() &&
             std::all_of(series.begin(), series.end(), [](const SiteSeries& s) { return s.key.stack == kEmptyStack; })) {
    // No stack captured at all (GPUSHIM_STACK_DEPTH=0): every allocation is one site, whose live
    // figure swings with the step's scratch memory, and no step can be found in a sequence of one
    // site. A leak of a few hundred KiB per step within a hundred MiB of scratch is then lost, and
    // "none" would tell the user that nothing grew.
    g.verdict = "not judged";
    g.evidence = "no stack was captured (GPUSHIM_STACK_DEPTH=0), so every allocation is one site and no step "
                 "can be found; capture stacks, or count iterations (GPUSHIM_ITERATION_SITE, "
                 "gpushim_mark_iteration)";
  } else {
    g.verdict = g.suspects.empty() ? "none" : "suspects";
    if (set_aside != 0)
      g.evidence += "; " + plural(set_aside, "site") + " that grew only while the program allocated nothing else (" +
                    "a load, not a leak, until a loop shows it growing) not counted";
  }
  return g;
}

}  // namespace gpushim
