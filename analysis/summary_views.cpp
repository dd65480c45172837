#include "summary_views.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "offline_symbolizer.h"

namespace gpushim::analysis {
namespace {

// PyTorch's small pool: blocks of at most 1 MiB (c10/cuda/CUDACachingAllocator.cpp, kSmallSize).
constexpr uint64_t kSmallBlock = 1ull << 20;

// One row of the table: current, peak, allocated total, freed total; unknown cells print "n/a".
struct Cells {
  std::optional<uint64_t> cur, peak, alloc, freed;
};

// Current, peak and totals as values go up and down.
struct Tally {
  uint64_t cur = 0, peak = 0, alloc = 0, freed = 0;
  void up(uint64_t v) {
    cur += v, alloc += v;
    peak = std::max(peak, cur);
  }
  void down(uint64_t v) {
    const uint64_t d = std::min(cur, v);
    cur -= d, freed += d;
  }
  Cells cells() const { return Cells{cur, peak, alloc, freed}; }
};

struct DeviceTallies {
  Tally bytes, bytes_large, bytes_small, requested, reserved, count, count_large, count_small, segments;
};

// torch's _format_size: whole units, the unit chosen from the row's first value, so that a
// column of one metric reads in one unit.
std::string torch_size(const std::optional<uint64_t>& v, const std::optional<uint64_t>& pref) {
  if (!v) return "     n/a  ";
  static const char* kUnits[] = {"B ", "KB", "MB", "GB", "TB", "PB"};
  uint64_t sz = *v;
  double p = static_cast<double>(pref.value_or(*v));
  int u = 0;
  while (u < 5 && p >= 768 * 1024) sz /= 1024, p /= 1024, ++u;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%7" PRIu64 " %s", sz, kUnits[u]);
  return buf;
}

// torch's _format_count: thousands (K, M) above 750,000.
std::string torch_count(const std::optional<uint64_t>& v, const std::optional<uint64_t>& pref) {
  if (!v) return "     n/a  ";
  static const char* kUnits[] = {" ", "K", "M"};
  uint64_t n = *v;
  double p = static_cast<double>(pref.value_or(*v));
  int u = 0;
  while (u < 2 && p >= 750 * 1000) n /= 1000, p /= 1000, ++u;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%7" PRIu64 " %s ", n, kUnits[u]);
  return buf;
}

std::string rule(char c) { return "|" + std::string(75, c) + "|\n"; }

std::string row(const char* name, const Cells& c, const Cells& pref, bool bytes) {
  auto f = bytes ? torch_size : torch_count;
  char buf[200];
  std::snprintf(buf, sizeof(buf), "| %-21s | %s | %s | %s | %s |\n", name, f(c.cur, pref.cur).c_str(),
                f(c.peak, pref.peak).c_str(), f(c.alloc, pref.alloc).c_str(), f(c.freed, pref.freed).c_str());
  return buf;
}

std::string extra_row(const char* name, const std::string& value) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "| %-21s | %-49.49s |\n", name, value.c_str());
  return buf;
}

std::map<int, DeviceTallies> tally_trace(const TraceData& t) {
  std::map<int, DeviceTallies> out;
  for (const TraceEvent& e : t.events) {
    const bool device_memory = (e.flags & trace::kFlagKindMask) == static_cast<uint8_t>(MemoryKind::kDevice);
    DeviceTallies* d = nullptr;
    switch (e.kind) {
      case EventKind::kAlloc:
      case EventKind::kFree: {
        if (!device_memory) break;
        d = &out[e.device];
        const bool small = e.size <= kSmallBlock, forwarded = (e.flags & trace::kFlagForwarded) != 0;
        if (e.kind == EventKind::kAlloc) {
          d->bytes.up(e.size), d->count.up(1), d->requested.up(e.requested);
          (small ? d->bytes_small : d->bytes_large).up(e.size);
          (small ? d->count_small : d->count_large).up(1);
          // Served by CUDA itself: its own driver allocation, as a segment is for the pool.
          if (forwarded) d->reserved.up(e.size), d->segments.up(1);
        } else {
          d->bytes.down(e.size), d->count.down(1), d->requested.down(e.requested);
          (small ? d->bytes_small : d->bytes_large).down(e.size);
          (small ? d->count_small : d->count_large).down(1);
          if (forwarded) d->reserved.down(e.size), d->segments.down(1);
        }
        break;
      }
      case EventKind::kSegmentAlloc:
      case EventKind::kSegmentMap:
        out[e.device].reserved.up(e.size), out[e.device].segments.up(1);
        break;
      case EventKind::kSegmentFree:
      case EventKind::kSegmentUnmap:
        out[e.device].reserved.down(e.size), out[e.device].segments.down(1);
        break;
      default: break;
    }
  }
  return out;
}

std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

}  // namespace

std::string torch_summary(const RunView& run, const TraceData* trace) {
  std::map<int, DeviceTallies> tallies;
  if (trace) tallies = tally_trace(*trace);
  std::string o;
  for (const DeviceReport& d : run.meta.devices) {
    const DeviceTallies* t = trace ? &tallies[d.device] : nullptr;
    const bool pooled = d.pool.segment_allocs != 0 || run.meta.policy == "caching" || run.meta.policy == "vmm";
    char buf[200];
    o += rule('=');
    std::snprintf(buf, sizeof(buf), "| %16s gpushim CUDA memory summary, device ID %-17d |\n", "", d.device);
    o += buf;
    o += rule('-');
    std::snprintf(buf, sizeof(buf), "|  %9s CUDA OOMs: %-12" PRIu64 " | %6s cudaMalloc retries: %-8s  |\n", "",
                  d.failed_allocs, "", trace ? "n/a" : std::to_string(d.pool.alloc_retries).c_str());
    o += buf;
    o += rule('=');
    o += "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n";
    auto block = [&](const char* name, const Cells& all, const Cells* large, const Cells* small, bool bytes) {
      o += rule('-');
      o += row(name, all, all, bytes);
      if (large) o += row("      from large pool", *large, all, bytes);
      if (small) o += row("      from small pool", *small, all, bytes);
    };
    if (t) {
      const Cells bl = t->bytes_large.cells(), bs = t->bytes_small.cells();
      const Cells cl = t->count_large.cells(), cs = t->count_small.cells();
      block("Allocated memory", t->bytes.cells(), &bl, &bs, true);
      block("Requested memory", t->requested.cells(), nullptr, nullptr, true);
      block("GPU reserved memory", t->reserved.cells(), nullptr, nullptr, true);
      block("Cached free memory", Cells{t->reserved.cur - std::min(t->reserved.cur, t->bytes.cur), {}, {}, {}}, nullptr,
            nullptr, true);
      block("Allocations", t->count.cells(), &cl, &cs, false);
      block("GPU reserved segments", t->segments.cells(), nullptr, nullptr, false);
    } else {
      block("Allocated memory", Cells{d.live_bytes, d.peak_allocated_bytes, {}, {}}, nullptr, nullptr, true);
      block("Requested memory",
            pooled ? Cells{d.pool.requested_bytes, d.pool.peak_requested_bytes, {}, {}} : Cells{}, nullptr, nullptr, true);
      block("GPU reserved memory", Cells{d.pool.reserved_bytes, d.peak_reserved_bytes, {}, {}}, nullptr, nullptr, true);
      block("Cached free memory", Cells{d.pool.cached_free_bytes, {}, {}, {}}, nullptr, nullptr, true);
      block("Allocations", Cells{d.live_count, {}, d.total_allocs, d.total_frees}, nullptr, nullptr, false);
      block("GPU reserved segments",
            pooled ? Cells{d.pool.segment_allocs - std::min(d.pool.segment_allocs, d.pool.segment_frees), {},
                           d.pool.segment_allocs, d.pool.segment_frees}
                   : Cells{},
            nullptr, nullptr, false);
    }
    o += rule('=');
    o += extra_row("gpushim", "policy " + run.meta.policy + (d.limit_bytes ? ", cap " + human_bytes(d.limit_bytes) : "") +
                                  (d.capacity_bytes ? ", capacity " + human_bytes(d.capacity_bytes) : ""));
    o += rule('-');
    o += extra_row("Largest free block", trace ? "n/a (a report has it)" : human_bytes(d.pool.largest_free_block));
    o += extra_row("Syncs for reuse", trace ? "n/a (a report has it)" : std::to_string(d.pool.reuse_syncs));
    o += extra_row("Peak allocated at", fmt_s(d.peak_allocated_at_s));
    std::string unaccounted = "n/a (a report has it)";
    if (!trace) {
      unaccounted = "not sampled";
      if (d.usage_sampled) {
        const double delta = d.usage_at_s - d.peak_allocated_at_s;
        unaccounted = human_bytes(d.unaccounted_bytes) + " at " + fmt_s(d.usage_at_s) +
                      (std::fabs(delta) < 0.005 ? ", at the peak"
                                                : ", " + fmt_s(std::fabs(delta)) + (delta < 0 ? " before" : " after") + " the peak");
      }
    }
    o += extra_row("Unaccounted", unaccounted);
    if (d.injected_failures) o += extra_row("Injected failures", std::to_string(d.injected_failures));
    o += rule('=');
  }
  if (run.meta.devices.empty()) o += "no device memory in this " + run.source + "\n";
  return o;
}

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
  uint64_t iteration = 0;
  for (const TraceEvent& e : t.events) {
    if (e.kind == EventKind::kIteration) {
      ++iteration;
      r.by_iteration = true;
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
    *o += indent + (last ? "└─ " : "├─ ") + human_bytes(c.bytes) + ", " + std::to_string(c.allocs) + " allocations  " +
          kids[i].first + "\n";
    if (depth + 1 < max_depth) render(c, indent + (last ? "   " : "│  "), depth + 1, max_depth, o);
  }
}

}  // namespace

std::string site_tree(const RunView& run, const SiteView& site, bool at_peak, size_t max_depth) {
  // The function the site allocates from: its innermost frame that is the program's own.
  const FrameInfo* focus = nullptr;
  for (const FrameInfo& f : site.frames)
    if (!is_plumbing_frame(f)) {
      focus = &f;
      break;
    }
  if (focus == nullptr) return "  (this site has no frame outside the shim and the CUDA runtime)\n";
  FrameInfo function_only = *focus;  // the tree is about the function, whichever line allocates
  function_only.line = 0;
  const std::string label = tree_label(function_only);
  auto same = [&](const FrameInfo& f) {
    return f.python == focus->python && f.function == focus->function && f.file == focus->file &&
           (f.function.empty() ? f.module_offset == focus->module_offset : true) && f.module == focus->module;
  };
  TreeNode callers, callees;
  uint64_t total_bytes = 0, total_allocs = 0, sites = 0;
  for (const SiteView& s : run.sites) {
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
  const std::string what = at_peak ? "at the peak" : run.meta.reason == "snapshot" ? "live at the snapshot" : "live at the end";
  std::string o = "  " + label + "\n  " + human_bytes(total_bytes) + " " + what + ", " + std::to_string(total_allocs) +
                  (run.source == "trace" ? " allocations over the run" : " allocations live") + ", in " +
                  std::to_string(sites) + (sites == 1 ? " site" : " sites") + "\n\n  Callers (who calls it, outward)\n";
  if (callers.children.empty()) o += "  └─ (the outermost frame recorded)\n";
  render(callers, "  ", 0, max_depth, &o);
  o += "\n  Callees (what it calls, down to the allocation)\n";
  render(callees, "  ", 0, max_depth, &o);
  return o;
}

}  // namespace gpushim::analysis
