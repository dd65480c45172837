#include "report/step_finder.h"

#include <algorithm>

#include "absl/container/node_hash_map.h"
#include "stacks/frame_roles.h"

namespace gpushim {
namespace {

struct Place {
  std::string who;   // the function, and its file (Python) or module (native)
  uint64_t where;    // its line (Python) or return address (native)
};

// The user frames of a stack, outermost first: what the step is looked for in.
std::vector<Place> user_places(const std::vector<FrameInfo>& frames) {
  std::vector<Place> out;
  for (size_t i = frames.size(); i-- > 0;) {
    const FrameInfo& f = frames[i];
    if (frame_role(f) != FrameRole::kUser || f.function.empty()) continue;
    out.push_back(Place{f.function + '\x1f' + (f.python ? f.file : f.module),
                        f.python ? static_cast<uint64_t>(f.line) : f.module_offset});
  }
  return out;
}

}  // namespace

uint64_t DetectedSteps::step_at(uint64_t allocs) const {
  if (allocs <= loop_begin) return before == 0 || loop_begin == 0 ? 0 : before * allocs / loop_begin;
  return before + static_cast<uint64_t>(std::lower_bound(starts.begin(), starts.end(), allocs) - starts.begin());
}

DetectedSteps find_steps(const DetectedPeriod& period, const StackFramesOf& frames_of) {
  DetectedSteps out;
  const uint64_t p = period.period, n = period.loop.size();
  if (p == 0 || n < p) return out;
  absl::node_hash_map<uint32_t, std::vector<Place>> places;  // references to entries are kept
  auto places_of = [&](uint32_t stack) -> const std::vector<Place>& {
    auto it = places.find(stack);
    if (it == places.end()) it = places.emplace(stack, user_places(frames_of(stack))).first;
    return it->second;
  };
  // The frames every allocation of the last pattern shares, from the outermost: the step's
  // function is among them. Allocations without user frames do not take part: PyTorch's backward
  // pass runs on the autograd engine's threads, whose stacks hold library frames only.
  std::vector<const std::vector<Place>*> pattern;
  for (uint64_t i = n - p; i < n; ++i) {
    const std::vector<Place>& pl = places_of(period.loop[i]);
    if (!pl.empty()) pattern.push_back(&pl);
  }
  if (pattern.size() < 2 || pattern.size() * 4 < p) return out;
  size_t depth = 0;  // frames in common
  for (;; ++depth) {
    bool common = true;
    for (const auto* pl : pattern)
      if (pl->size() <= depth || (*pl)[depth].who != (*pattern[0])[depth].who) {
        common = false;
        break;
      }
    if (!common) break;
  }
  // The innermost shared frame whose place varies: deeper shared frames are helpers every
  // allocation goes through (one `alloc()` line), and there the step does not show.
  while (depth > 0) {
    bool varies = false;
    for (const auto* pl : pattern) varies = varies || (*pl)[depth - 1].where != (*pattern[0])[depth - 1].where;
    if (varies) break;
    --depth;
  }
  if (depth == 0) return out;
  const std::vector<Place> prefix(pattern[0]->begin(), pattern[0]->begin() + static_cast<std::ptrdiff_t>(depth));
  // Where each allocation is in the step's function; none when it runs outside it.
  auto place_in_step = [&](uint32_t stack, uint64_t* where) {
    const std::vector<Place>& pl = places_of(stack);
    if (pl.size() < depth) return false;
    for (size_t d = 0; d < depth; ++d)
      if (pl[d].who != prefix[d].who) return false;
    *where = pl[depth - 1].where;
    return true;
  };
  bool have_prev = false;
  uint64_t prev = 0;
  uint64_t in_last_pattern = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t where = 0;
    if (!place_in_step(period.loop[i], &where)) continue;
    if (!have_prev || where < prev) {
      out.starts.push_back(period.loop_begin + i);
      in_last_pattern += have_prev && i >= n - p;
    }
    have_prev = true;
    prev = where;
  }
  // A function that allocates at one place, or only ever further on, shows no step inside the
  // pattern: the pattern is the step.
  if (in_last_pattern == 0) return DetectedSteps{};
  out.per_pattern = in_last_pattern;
  out.function = prefix[depth - 1].who.substr(0, prefix[depth - 1].who.find('\x1f'));
  out.loop_begin = period.loop_begin;
  // The ring wrapped inside the loop: the steps before it at the pattern's rate.
  if (period.wrapped) out.before = period.loop_begin * out.per_pattern / p;
  out.steps = out.before + out.starts.size();
  return out;
}

}  // namespace gpushim
