#include "summary_views.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "offline_symbolizer.h"
#include "stacks/frame_roles.h"
#include "util/text.h"

namespace gpushim::analysis {

AllocationRankings rank_allocations(const TraceData& t, double temporary_ms) {
  AllocationRankings r;
  r.temporary_ms = temporary_ms;
  const uint64_t window_ns = static_cast<uint64_t>(std::max(0.0, temporary_ms) * 1e6);
  struct Live {
    uint64_t t_ns;
    uint64_t iteration;
  };
  absl::flat_hash_map<SiteKey, AllocationRank> sites;
  absl::flat_hash_map<std::pair<int16_t, uint64_t>, Live> live;  // (device, addr) -> when allocated
  // Known before the scan: the frees of the first iteration (before the first mark) count by
  // iteration too. Judged by the time window alone, a first iteration slowed by start-up (first
  // touches, stacks seen for the first time) lost some of its temporaries.
  r.by_iteration = std::any_of(t.events.begin(), t.events.end(),
                               [](const TraceEvent& e) { return e.kind == EventKind::kIteration; });
  uint64_t iteration = 0;
  for (const TraceEvent& e : t.events) {
    if (e.kind == EventKind::kIteration) {
      ++iteration;
      continue;
    }
    if (e.kind != EventKind::kAlloc && e.kind != EventKind::kFree) continue;
    const SiteKey k = site_key(e);
    if (e.kind == EventKind::kAlloc) {
      AllocationRank& s = sites[k];
      ++s.allocs, s.bytes += e.size;
      live[{e.device, e.addr}] = Live{e.t_ns, iteration};
      continue;
    }
    auto it = live.find(std::pair<int16_t, uint64_t>{e.device, e.addr});
    if (it == live.end()) continue;
    const Live l = it->second;
    live.erase(it);
    if ((e.t_ns >= l.t_ns && e.t_ns - l.t_ns <= window_ns) || (r.by_iteration && l.iteration == iteration)) {
      AllocationRank& s = sites[k];
      ++s.temporary, s.temporary_bytes += e.size;
    }
  }
  OfflineSymbolizer sym(t);
  // Stacks that symbolize alike are one site, as everywhere else in the tool.
  std::map<std::string, size_t> by_identity;
  for (auto& [k, s] : sites) {
    s.device = k.device;
    s.kind = memory_kind_name(k.kind);
    s.frames = sym.stack(k.stack);
    SiteView id;
    id.device = s.device, id.kind = s.kind, id.frames = s.frames;
    auto [it, fresh] = by_identity.emplace(site_identity(id), r.sites.size());
    if (fresh) {
      r.sites.push_back(std::move(s));
      continue;
    }
    AllocationRank& into = r.sites[it->second];
    into.allocs += s.allocs, into.bytes += s.bytes, into.temporary += s.temporary, into.temporary_bytes += s.temporary_bytes;
  }
  return r;
}

namespace {

// A frame's name in the tree: the function and where, without the module for Python frames.
std::string tree_label(const FrameInfo& f) { return describe_frame(f); }

struct TreeNode {
  uint64_t bytes = 0, allocs = 0, sites = 0;
  std::map<std::string, TreeNode> children;
};

void render(const TreeNode& n, const std::string& indent, size_t depth, size_t max_depth, std::string* o) {
  std::vector<std::pair<std::string, const TreeNode*>> kids;
  for (const auto& [name, c] : n.children) kids.emplace_back(name, &c);
  std::sort(kids.begin(), kids.end(), [](const auto& a, const auto& b) {
    return a.second->bytes != b.second->bytes ? a.second->bytes > b.second->bytes : a.second->allocs > b.second->allocs;
  });
  for (size_t i = 0; i < kids.size(); ++i) {
    const bool last = i + 1 == kids.size();
    const TreeNode& c = *kids[i].second;
    *o += indent + (last ? "└─ " : "├─ ") + human_bytes(c.bytes) + ", " + plural(c.allocs, "allocation") + "  " +
          kids[i].first + "\n";
    if (depth + 1 < max_depth) render(c, indent + (last ? "   " : "│  "), depth + 1, max_depth, o);
  }
}

}  // namespace

std::string site_tree(const RunView& run, const SiteView& site, bool at_peak, size_t max_depth) {
  // The function the site allocates from: its innermost frame that is the program's own.
  const FrameInfo* focus = user_frame(site.frames);
  if (focus == nullptr) return "  (this site has no frame outside the shim and the CUDA runtime)\n";
  FrameInfo function_only = *focus;  // the tree is about the function, whichever line allocates
  function_only.line = 0;
  const std::string label = tree_label(function_only);
  auto same = [&](const FrameInfo& f) {
    return f.python == focus->python && f.function == focus->function && f.file == focus->file &&
           (f.function.empty() ? f.module_offset == focus->module_offset : true) && f.module == focus->module;
  };
  // Each device has its own peak, at its own moment: bytes at two devices' peaks do not add up
  // to anything that was ever live at once, so at the peak the tree is the chosen site's device.
  bool other_devices = false;
  for (const SiteView& s : run.sites) other_devices |= s.device != site.device;
  const bool one_device = at_peak && other_devices;
  TreeNode callers, callees;
  uint64_t total_bytes = 0, total_allocs = 0, sites = 0;
  for (const SiteView& s : run.sites) {
    if (one_device && s.device != site.device) continue;
    // The outermost activation of the function on this stack: recursion counts once.
    std::vector<const FrameInfo*> frames;
    for (const FrameInfo& f : s.frames)
      if (!is_plumbing_frame(f)) frames.push_back(&f);
    size_t at = frames.size();
    for (size_t i = frames.size(); i-- > 0;)
      if (same(*frames[i])) {
        at = i;
        break;
      }
    if (at == frames.size()) continue;
    const uint64_t bytes = at_peak ? s.at_device_peak_bytes : s.live_bytes;
    const uint64_t allocs = s.total_allocs ? s.total_allocs : s.live_count;
    total_bytes += bytes, total_allocs += allocs, ++sites;
    TreeNode* n = &callers;
    for (size_t i = at + 1; i < frames.size(); ++i) {  // outward: who called it
      n = &n->children[tree_label(*frames[i])];
      n->bytes += bytes, n->allocs += allocs, ++n->sites;
    }
    n = &callees;
    for (size_t i = at; i-- > 0;) {  // inward: down to the allocating call
      n = &n->children[tree_label(*frames[i])];
      n->bytes += bytes, n->allocs += allocs, ++n->sites;
    }
    if (at == 0) {
      n = &n->children["(allocates here) line " + std::to_string(frames[0]->line)];
      n->bytes += bytes, n->allocs += allocs, ++n->sites;
    }
  }
  const std::string what = one_device ? "at device " + std::to_string(site.device) + "'s peak"
                           : at_peak  ? "at the peak"
                                      : run.meta.reason == "snapshot" ? "live at the snapshot" : "live at the end";
  std::string o = "  " + label + "\n  " + human_bytes(total_bytes) + " " + what + ", " + plural(total_allocs, "allocation") +
                  (run.source == "trace" ? " over the run" : " live") + ", in " + plural(sites, "site") + "\n\n  Callers (who calls it, outward)\n";
  if (callers.children.empty()) o += "  └─ (the outermost frame recorded)\n";
  render(callers, "  ", 0, max_depth, &o);
  o += "\n  Callees (what it calls, down to the allocation)\n";
  render(callees, "  ", 0, max_depth, &o);
  return o;
}

}  // namespace gpushim::analysis
