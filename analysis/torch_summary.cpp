#include "torch_summary.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <map>

#include "accounting/allocation_tracker.h"
#include "accounting/torch_stats.h"
#include "replay.h"

namespace gpushim::analysis {
namespace {

// torch's _format_size: the unit is chosen from the row's reference value (the "all" row's value
// of the column), so that a column of one metric reads in one unit.
std::string format_size(const std::optional<uint64_t>& v, const std::optional<uint64_t>& pref) {
  if (!v) return "   n/a    ";
  static const char* kUnits[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  uint64_t sz = *v;
  double p = static_cast<double>(pref.value_or(*v));
  int u = 0;
  while (u < 5 && !(p < 768 * 1024)) sz /= 1024, p /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%6" PRIu64 " %s", sz, kUnits[u]);
  return buf;
}

// torch's _format_count: thousands (K, M) from 750,000 on.
std::string format_count(const std::optional<uint64_t>& v, const std::optional<uint64_t>& pref) {
  if (!v) return "    n/a   ";
  static const char* kUnits[] = {" ", "K", "M"};
  uint64_t n = *v;
  double p = static_cast<double>(pref.value_or(*v));
  int u = 0;
  while (u < 2 && !(p < 750 * 1000)) n /= 1000, p /= 1000, ++u;
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%7" PRIu64 " %s ", n, kUnits[u]);
  return buf;
}

using Formatter = std::string (*)(const std::optional<uint64_t>&, const std::optional<uint64_t>&);

std::string stat_row(const char* name, const TorchStat& s, const TorchStat& pref, Formatter f) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), " %-21s | %s | %s | %s | %s ", name, f(s.current, pref.current).c_str(),
                f(s.peak, pref.peak).c_str(), f(s.allocated, pref.allocated).c_str(), f(s.freed, pref.freed).c_str());
  return buf;
}

std::string left(const std::optional<uint64_t>& v, int width) {
  char buf[48];
  if (v) std::snprintf(buf, sizeof(buf), "%-*" PRIu64, width, *v);
  else std::snprintf(buf, sizeof(buf), "%-*s", width, "n/a");
  return buf;
}

namespace ts = torch_stats;
using ts::Sync;

// The analysis's metrics (memory_summary()'s order) as torch_stats' (memory_stats()'s).
constexpr ts::Metric kStatOf[kTorchMetrics] = {ts::kAllocatedBytes, ts::kActiveBytes, ts::kRequestedBytes,
                                               ts::kReservedBytes,  ts::kInactiveSplitBytes, ts::kAllocation,
                                               ts::kActive,         ts::kSegment,      ts::kInactiveSplit};
constexpr ts::Pool kPoolOf[kTorchPools] = {ts::kAll, ts::kLarge, ts::kSmall};

TorchStat cell(const ts::Values& v) { return TorchStat{v.current, v.peak, v.allocated, v.freed}; }

// Every cell from the shared figures; the non-releasable ones n/a where they were not kept.
TorchDeviceStats from_figures(int device, const ts::Figures& f) {
  TorchDeviceStats s;
  s.device = device;
  for (int m = 0; m < kTorchMetrics; ++m) {
    const bool split = m == kInactiveSplitBytes || m == kInactiveSplit;
    if (split && !f.split_known) continue;
    for (int p = 0; p < kTorchPools; ++p) s.stats[m][p] = cell(f.stat[kStatOf[m]][kPoolOf[p]]);
  }
  s.oversize_allocations = cell(f.oversize_allocations);
  s.oversize_segments = cell(f.oversize_segments);
  return s;
}

// A segment (or, under vmm, a run of adjacent mappings) with the blocks inside it: where each
// block lies (torch_stats::Place), which the core learns from the pool and a trace from its events.
struct Segment {
  uint64_t size = 0;
  ts::Pool pool = ts::kLarge;
  bool mapped = false;
  std::map<uint64_t, uint64_t> blocks;  // addr -> size
};

// Free bytes and free pieces of a segment with blocks in it (nothing when it is wholly free: that
// one is releasable).
ts::SplitChange inactive_of(uint64_t addr, const Segment& s) {
  if (s.blocks.empty()) return {0, 0};
  int64_t bytes = 0, pieces = 0;
  uint64_t at = addr;
  for (const auto& [a, n] : s.blocks) {
    if (a > at) bytes += static_cast<int64_t>(a - at), ++pieces;
    at = std::max(at, a + n);
  }
  if (at < addr + s.size) bytes += static_cast<int64_t>(addr + s.size - at), ++pieces;
  return {bytes, pieces};
}

// One device's events through torch_stats' rules, as the core applies them while it accounts.
class DeviceTally {
 public:
  void alloc(const TraceEvent& e) {
    if (e.flags & trace::kFlagForwarded) {
      // Served by CUDA itself: a segment of its own, wholly in use, as cudaMalloc'd memory is.
      stats_.forwarded<Sync::kLocked>(e.size, e.requested, +1);
      return;
    }
    stats_.block<Sync::kLocked>(e.size, e.requested, +1);
    auto [base, seg] = containing(e.addr, e.size);
    if (!seg) return;
    auto next = seg->blocks.lower_bound(e.addr);
    const uint64_t n = next == seg->blocks.end() ? base + seg->size : next->first;
    const uint64_t p = next == seg->blocks.begin() ? base : std::prev(next)->first + std::prev(next)->second;
    if (p > e.addr || e.addr + e.size > n) return;  // over another block: a free was lost
    const ts::Place place{seg->size, seg->blocks.empty(), p < e.addr, e.addr + e.size < n};
    stats_.split<Sync::kLocked>(seg->pool, ts::split_on_alloc(e.size, place));
    seg->blocks.emplace(e.addr, e.size);
  }

  void free(const TraceEvent& e) {
    if (e.flags & trace::kFlagForwarded) {
      stats_.forwarded<Sync::kLocked>(e.size, e.requested, -1);
      return;
    }
    stats_.block<Sync::kLocked>(e.size, e.requested, -1);
    auto [base, seg] = containing(e.addr, e.size);
    if (!seg) return;
    auto it = seg->blocks.find(e.addr);
    if (it == seg->blocks.end()) return;
    const uint64_t p = it == seg->blocks.begin() ? base : std::prev(it)->first + std::prev(it)->second;
    const uint64_t n = std::next(it) == seg->blocks.end() ? base + seg->size : std::next(it)->first;
    const ts::Place place{seg->size, seg->blocks.size() == 1, p < e.addr, e.addr + e.size < n};
    stats_.split<Sync::kLocked>(seg->pool, ts::split_on_free(e.size, place));
    seg->blocks.erase(it);
  }

  void segment_alloc(uint64_t addr, uint64_t size) {
    stats_.segment<Sync::kLocked>(size, +1);
    Segment s;
    s.size = size;
    s.pool = ts::segment_pool(size);
    segs_[addr] = std::move(s);
  }

  void segment_free(uint64_t addr, uint64_t size) {
    auto it = segs_.find(addr);
    if (it == segs_.end()) {
      stats_.segment<Sync::kLocked>(size, -1);
      return;
    }
    forget_inactive(it->first, it->second);
    stats_.segment<Sync::kLocked>(it->second.size, -1);
    segs_.erase(it);
  }

  // vmm: a mapping next to a mapped run extends it, as an expandable segment grows. `shared`: the
  // memory is mapped elsewhere too, and reserved there (trace_format.h, kFlagSharedMapping).
  void map(uint64_t addr, uint64_t size, bool shared) {
    stats_.mapping<Sync::kLocked>(shared ? 0 : static_cast<int64_t>(size), runs_.map(addr, size));
    auto after = segs_.find(addr + size);
    auto before = segs_.lower_bound(addr);
    Segment* grown = nullptr;
    uint64_t base = addr;
    if (before != segs_.begin() && std::prev(before)->second.mapped &&
        std::prev(before)->first + std::prev(before)->second.size == addr) {
      base = std::prev(before)->first;
      grown = &std::prev(before)->second;
      forget_inactive(base, *grown);
      grown->size += size;
    } else {
      Segment s;
      s.size = size;
      s.pool = ts::kLarge;
      s.mapped = true;
      grown = &(segs_[addr] = std::move(s));
    }
    if (after != segs_.end() && after->second.mapped) {
      forget_inactive(after->first, after->second);
      grown->size += after->second.size;
      grown->blocks.merge(after->second.blocks);
      segs_.erase(after);
    }
    count_inactive(base, *grown);
  }

  void unmap(uint64_t addr, uint64_t size, bool shared) {
    stats_.mapping<Sync::kLocked>(shared ? 0 : -static_cast<int64_t>(size), runs_.unmap(addr, size));
    auto [base, seg] = containing(addr, size);
    if (!seg) return;
    Segment whole = std::move(*seg);
    forget_inactive(base, whole);
    segs_.erase(base);
    auto piece = [&](uint64_t from, uint64_t to) {
      if (from >= to) return;
      Segment s;
      s.size = to - from;
      s.pool = ts::kLarge;
      s.mapped = true;
      for (auto it = whole.blocks.lower_bound(from); it != whole.blocks.end() && it->first < to; ++it)
        s.blocks.insert(*it);
      count_inactive(from, s);
      segs_[from] = std::move(s);
    };
    piece(base, addr);
    piece(addr + size, base + whole.size);
  }

  TorchDeviceStats stats(int device) const { return from_figures(device, stats_.snapshot()); }
  void set_max_split(uint64_t bytes) { stats_.set_max_split(bytes); }

 private:
  std::pair<uint64_t, Segment*> containing(uint64_t addr, uint64_t size) {
    auto it = segs_.upper_bound(addr);
    if (it == segs_.begin()) return {0, nullptr};
    --it;
    if (addr + size > it->first + it->second.size) return {0, nullptr};
    return {it->first, &it->second};
  }
  void forget_inactive(uint64_t base, const Segment& s) {
    const ts::SplitChange c = inactive_of(base, s);
    stats_.split<Sync::kLocked>(s.pool, {-c.bytes, -c.pieces});
  }
  void count_inactive(uint64_t base, const Segment& s) { stats_.split<Sync::kLocked>(s.pool, inactive_of(base, s)); }

  ts::DeviceStats stats_;
  ts::MappedRuns runs_;
  std::map<uint64_t, Segment> segs_;
};

bool pooled(const RunView& run, const DeviceReport& d) {
  return d.pool.segment_allocs != 0 || run.meta.policy == "caching" || run.meta.policy == "vmm";
}

TorchDeviceStats from_report(const RunView& run, const DeviceReport& d) {
  TorchDeviceStats s;
  if (d.torch) {
    // A shim from issue 31 on keeps the figures as it accounts, by the rules this tally follows.
    s = from_figures(d.device, *d.torch);
  } else {
    // An older shim's report: what its counters hold. No byte totals, no pool split, no peaks of
    // counts, no non-releasable memory.
    s.device = d.device;
    auto& st = s.stats;
    st[kAllocatedBytes][kAllPools] = TorchStat{d.live_bytes, d.peak_bytes, {}, {}};
    st[kActiveBytes][kAllPools] = st[kAllocatedBytes][kAllPools];
    if (pooled(run, d)) st[kRequestedBytes][kAllPools] = TorchStat{d.pool.requested_bytes, d.pool.peak_requested_bytes, {}, {}};
    st[kReservedBytes][kAllPools] = TorchStat{d.pool.reserved_bytes, d.peak_reserved_bytes, {}, {}};
    st[kAllocation][kAllPools] = TorchStat{d.live_count, {}, d.total_allocs, d.total_frees};
    st[kActive][kAllPools] = st[kAllocation][kAllPools];
    if (pooled(run, d))
      st[kSegment][kAllPools] = TorchStat{d.pool.segment_allocs - std::min(d.pool.segment_allocs, d.pool.segment_frees), {},
                                          d.pool.segment_allocs, d.pool.segment_frees};
    else  // passthrough: every allocation is CUDA's own, a segment of its own
      st[kSegment][kAllPools] = st[kAllocation][kAllPools];
    s.oversize_allocations = s.oversize_segments = TorchStat{0, 0, 0, 0};
  }
  s.num_ooms = pooled(run, d) ? d.pool.ooms : d.failed_allocs;
  s.num_alloc_retries = d.pool.alloc_retries;
  return s;
}

// The pool's max_split (what "oversize" counts), as the run's settings gave it to the caching
// pool: the one pool that has it (DeviceMemoryResource::max_split), not wrapped by the own-segment
// resource, which does not pass it on.
uint64_t recorded_max_split(const TraceData& t) {
  Config config;
  std::vector<std::string> notes;
  std::string error;
  if (t.header.policy != "caching" || !recorded_config(t, {}, &config, &notes, &error) || config.own_segment_min != 0)
    return UINT64_MAX;
  return config.max_split;
}

std::vector<TorchDeviceStats> from_trace(const RunView& run, const TraceData& t) {
  std::map<int, DeviceTally> tallies;
  const uint64_t max_split = recorded_max_split(t);
  for (const DeviceReport& d : run.meta.devices) tallies[d.device].set_max_split(max_split);
  std::map<int, uint64_t> ooms;
  for (const TraceEvent& e : t.events) {
    const bool device_memory = (e.flags & trace::kFlagKindMask) == static_cast<uint8_t>(MemoryKind::kDevice);
    switch (e.kind) {
      case EventKind::kAlloc:
        if (device_memory) tallies[e.device].alloc(e);
        break;
      case EventKind::kFree:
        if (device_memory) tallies[e.device].free(e);
        break;
      case EventKind::kSegmentAlloc: tallies[e.device].segment_alloc(e.addr, e.size); break;
      case EventKind::kSegmentFree: tallies[e.device].segment_free(e.addr, e.size); break;
      case EventKind::kSegmentMap: tallies[e.device].map(e.addr, e.size, e.flags & trace::kFlagSharedMapping); break;
      case EventKind::kSegmentUnmap:
        tallies[e.device].unmap(e.addr, e.size, e.flags & trace::kFlagSharedMapping);
        break;
      case EventKind::kOom: ++ooms[e.device]; break;
      default: break;
    }
  }
  std::vector<TorchDeviceStats> out;
  for (const DeviceReport& d : run.meta.devices) {
    TorchDeviceStats s = tallies[d.device].stats(d.device);
    s.num_ooms = ooms[d.device];
    // Retries (a failed cudaMalloc followed by freeing the cache) are counted by the pool: the
    // trace's end chunk has its count (none in a trace cut short, or from an older shim).
    if (t.end)
      for (const trace::DeviceTotals& e : t.end->devices)
        if (e.ordinal == d.device) s.num_alloc_retries = e.alloc_retries;
    out.push_back(std::move(s));
  }
  return out;
}

std::string rule(char c) { return "|" + std::string(75, c) + "|\n"; }


std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

}  // namespace

std::string torch_table_extra_row(const std::string& name, const std::string& value) {
  constexpr size_t kWidth = 49;  // the value's column, between the table's borders
  std::string out, rest = value;
  bool first = true;
  do {
    size_t take = rest.size();
    if (take > kWidth) {
      // The last space that leaves a row within the width; a word longer than the row is split.
      const size_t space = rest.rfind(' ', kWidth);
      take = space == std::string::npos || space == 0 ? kWidth : space;
    }
    char buf[200];
    std::snprintf(buf, sizeof(buf), "| %-21.21s | %-49s |\n", first ? name.c_str() : "", rest.substr(0, take).c_str());
    out += buf;
    rest.erase(0, take);
    if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
    first = false;
  } while (!rest.empty());
  return out;
}

std::string render_torch_table(const TorchDeviceStats& s) {
  static const struct {
    TorchMetric metric;
    const char* name;
    Formatter f;
  } kRows[] = {
      {kAllocatedBytes, "Allocated memory", format_size},     {kActiveBytes, "Active memory", format_size},
      {kRequestedBytes, "Requested memory", format_size},     {kReservedBytes, "GPU reserved memory", format_size},
      {kInactiveSplitBytes, "Non-releasable memory", format_size}, {kAllocation, "Allocations", format_count},
      {kActive, "Active allocs", format_count},               {kSegment, "GPU reserved segments", format_count},
      {kInactiveSplit, "Non-releasable allocs", format_count},
  };
  std::vector<std::string> lines;
  char buf[200];
  lines.push_back(std::string(75, '='));
  std::snprintf(buf, sizeof(buf), " %16s gpushim CUDA memory summary, device ID %-17d ", "", s.device);
  lines.push_back(buf);
  lines.push_back(std::string(75, '-'));
  lines.push_back("  " + std::string(9, ' ') + " CUDA OOMs: " + left(s.num_ooms, 12) + " | " + std::string(6, ' ') +
                  " cudaMalloc retries: " + left(s.num_alloc_retries, 8) + "  ");
  lines.push_back(std::string(75, '='));
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  for (const auto& r : kRows) {
    lines.push_back(std::string(75, '-'));
    const auto& st = s.stats[r.metric];
    lines.push_back(stat_row(r.name, st[kAllPools], st[kAllPools], r.f));
    lines.push_back(stat_row("      from large pool", st[kLargePool], st[kAllPools], r.f));
    lines.push_back(stat_row("      from small pool", st[kSmallPool], st[kAllPools], r.f));
  }
  for (const auto& [stat, name] : {std::pair<const TorchStat*, const char*>{&s.oversize_allocations, "Oversize allocations"},
                                   {&s.oversize_segments, "Oversize GPU segments"}}) {
    lines.push_back(std::string(75, '-'));
    lines.push_back(stat_row(name, *stat, *stat, format_count));
  }
  lines.push_back(std::string(75, '='));
  std::string o;
  for (const std::string& l : lines) o += "|" + l + "|\n";
  return o;
}

std::vector<TorchDeviceStats> torch_stats(const RunView& run, const TraceData* trace) {
  if (trace) return from_trace(run, *trace);
  std::vector<TorchDeviceStats> out;
  for (const DeviceReport& d : run.meta.devices) out.push_back(from_report(run, d));
  return out;
}

std::string torch_summary(const RunView& run, const TraceData* trace) {
  const std::vector<TorchDeviceStats> all = torch_stats(run, trace);
  std::string o;
  for (size_t i = 0; i < all.size(); ++i) {
    const TorchDeviceStats& s = all[i];
    const DeviceReport& d = run.meta.devices[i];
    o += render_torch_table(s);
    // The shim's own rows, below torch's table and apart from it.
    o += torch_table_extra_row("gpushim", "policy " + run.meta.policy + (d.limit_bytes ? ", cap " + human_bytes(d.limit_bytes) : "") +
                                  (d.capacity_bytes ? ", capacity " + human_bytes(d.capacity_bytes) : ""));
    o += rule('-');
    const TorchStat& reserved = s.stats[kReservedBytes][kAllPools];
    const TorchStat& allocated = s.stats[kAllocatedBytes][kAllPools];
    const uint64_t cached = trace ? *reserved.current - std::min(*reserved.current, *allocated.current) : d.pool.cached_free_bytes;
    o += torch_table_extra_row("Cached free memory", human_bytes(cached));
    o += torch_table_extra_row("Largest free block", trace ? "n/a (a report has it)" : human_bytes(d.pool.largest_free_block));
    o += torch_table_extra_row("Syncs for reuse", trace ? "n/a (a report has it)" : std::to_string(d.pool.reuse_syncs));
    o += torch_table_extra_row("Peak allocated at", fmt_s(d.peak_allocated_at_s));
    o += torch_table_extra_row("Duration", fmt_s(run.meta.duration_s));
    std::string unaccounted = "n/a (a report has it)";
    if (!trace) {
      unaccounted = "not sampled";
      if (d.usage_sampled) {
        unaccounted = human_bytes(d.unaccounted_bytes) + " at " + fmt_s(d.usage_at_s) + ", " + sample_vs_peak(d);
      }
    }
    o += torch_table_extra_row("Unaccounted", unaccounted);
    if (d.injected_failures) o += torch_table_extra_row("Injected failures", std::to_string(d.injected_failures));
    o += rule('=');
  }
  if (run.meta.devices.empty()) o += "no device memory in this " + run.source + "\n";
  return o;
}

}  // namespace gpushim::analysis
