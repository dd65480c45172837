#include "report/report_builder.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "report/oom_advice.h"
#include "stacks/frame_roles.h"
#include "stacks/site_identity.h"
#include "util/clock.h"

namespace gpushim {
namespace {

// One row of the report's site lists (live sites, freed by reset): `totals` as live bytes.
SiteReport site_report(const SiteKey& key, const SiteTotals& totals, std::vector<FrameInfo> frames) {
  SiteReport s;
  s.device = key.device;
  s.kind = memory_kind_name(key.kind);
  s.live_bytes = totals.bytes;
  s.live_count = totals.count;
  s.stack_id = key.stack;
  s.frames = std::move(frames);
  return s;
}

// Under PyTorch's caching allocator (the user kept it), what its frames allocated is its cache.
const char* owner_of(const std::vector<FrameInfo>& frames, bool torch_cache) {
  if (!torch_cache) return "";
  for (const FrameInfo& f : frames)
    if (torch_allocator_frame(f)) return "PyTorch cache";
  return "";
}

// Largest first; ties in stack order, so that a report is the same from run to run.
bool largest_site_first(const SiteReport& a, const SiteReport& b) {
  if (a.live_bytes != b.live_bytes) return a.live_bytes > b.live_bytes;
  return a.stack_id < b.stack_id;
}

// The device entry's driver-usage figures: the last sample, if any.
void add_driver_usage(const ReportSources& in, int dev, DeviceReport* out) {
  const UsageSample u = in.usage->last(dev);
  if (!u.valid) return;
  out->usage_sampled = true;
  out->usage_at_s = u.t_ns > in.start_ns ? static_cast<double>(u.t_ns - in.start_ns) / 1e9 : 0;
  out->driver_used_bytes = u.used;
  out->held_bytes = u.held;
  out->unaccounted_bytes = u.used > u.held ? u.used - u.held : 0;
}

void add_modules(const ReportSources& in, const LiveSnapshot& now, ReportData* out) {
  for (const LiveSnapshot::ModuleLive& row : now.modules) {
    const ModuleId id = row.id;
    const int dev = row.device;
    const MemoryKind kind = row.kind;
    ModuleSnapshot snap = row.figures;
    if (snap.total_allocs == 0) continue;
    // After the interpreter began its teardown, live memory is that of the moment, as for the
    // devices and the sites (a row first used later had none then).
    if (in.teardown) {
      snap.live_bytes = snap.live_count = 0;
      for (const LiveSnapshot::ModuleLive& m : in.teardown->modules)
        if (m.id == id && m.device == dev && m.kind == kind) {
          snap.live_bytes = m.figures.live_bytes;
          snap.live_count = m.figures.live_count;
        }
    }
    ModuleReport m;
    if (id == ModuleCounters::kOverflowModule) m.module = "(other modules)";
    else if (id == kUnknownModule) m.module = "(unknown)";
    else m.module = in.modules->name(id);
    m.device = on_device(kind) ? dev : -1;
    m.kind = memory_kind_name(kind);
    m.set_figures(snap);
    out->modules.push_back(std::move(m));
  }
  std::sort(out->modules.begin(), out->modules.end(), [](const ModuleReport& a, const ModuleReport& b) {
    if ((a.kind == "device") != (b.kind == "device")) return a.kind == "device";
    if (a.kind != b.kind) return a.kind < b.kind;
    if (a.device != b.device) return a.device < b.device;
    if (a.live_bytes != b.live_bytes) return a.live_bytes > b.live_bytes;
    return a.module < b.module;
  });
  out->reserved_va_bytes = in.reserved_va_bytes;
}

}  // namespace

LiveSnapshot read_live_moment(const Ledgers& books, const std::vector<const DeviceLedger*>& devices, uint64_t t_ns) {
  LiveSnapshot m;
  m.t_ns = t_ns;
  const AllocationTracker& records = books.records();
  std::vector<bool> whole;  // by ordinal: read under its pool's lock
  for (const DeviceLedger* d : devices) {
    const auto o = static_cast<size_t>(d->ordinal());
    if (m.devices.size() <= o) {
      m.devices.resize(o + 1);
      m.pools.resize(o + 1);
      whole.resize(o + 1);
    }
    whole[o] = d->pool_keeps_records();
    const auto mine = [&](int device, MemoryKind kind) { return on_device(kind) && device == d->ordinal(); };
    d->locked([&] {
      m.devices[o] = d->counters().snapshot();
      if (!whole[o]) return;
      d->append_pooled_sites(&m.sites);
      for (const auto& site : records.sites())
        if (mine(site.first.device, site.first.kind)) m.sites.push_back(site);
      records.modules().for_each([&](ModuleId id, int dev, MemoryKind kind, const ModuleTotals& c) {
        if (mine(dev, kind)) m.modules.push_back({id, dev, kind, c.snapshot()});
      });
    });
    m.pools[o] = d->figures();  // takes the pool's lock itself
  }
  const auto read_whole = [&](int device, MemoryKind kind) {
    return on_device(kind) && device >= 0 && static_cast<size_t>(device) < whole.size() && whole[device];
  };
  for (const auto& site : records.sites())
    if (!read_whole(site.first.device, site.first.kind)) m.sites.push_back(site);
  records.modules().for_each([&](ModuleId id, int dev, MemoryKind kind, const ModuleTotals& c) {
    if (!read_whole(dev, kind)) m.modules.push_back({id, dev, kind, c.snapshot()});
  });
  // A site may have both forwarded and pooled allocations live (the driver API next to cudaMalloc).
  absl::flat_hash_map<SiteKey, SiteTotals> merged;
  for (const auto& [key, totals] : m.sites) {
    SiteTotals& t = merged[key];
    t.bytes += totals.bytes;
    t.count += totals.count;
  }
  if (merged.size() != m.sites.size()) m.sites.assign(merged.begin(), merged.end());
  return m;
}

ReportData build_report(const ReportSources& in) {
  ReportData r;
  r.pid = in.pid;
  r.exe = in.exe;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) r.host = host;
  if (const char* rank = getenv("RANK")) r.rank = rank;
  r.policy = in.policy;
  r.reason = in.reason;
  r.wall_time_s = static_cast<double>(wall_ns()) / 1e9;
  r.duration_s = static_cast<double>(now_ns() - in.start_ns) / 1e9;
  r.stack_depth = in.stack_depth;
  // After the interpreter began its teardown, the program's figures are those of that moment.
  const LiveSnapshot* teardown = in.teardown;
  // Every figure of the program's memory from one moment, read before anything slow.
  std::vector<const DeviceLedger*> ledgers;
  for (const DeviceSource& d : in.devices) ledgers.push_back(d.ledger);
  const LiveSnapshot now = read_live_moment(*in.books, ledgers, now_ns() - in.start_ns);
  std::vector<std::pair<SiteKey, SiteTotals>> live = now.sites;
  absl::flat_hash_map<SiteKey, SiteTotals> shutdown_freed;
  if (teardown) {
    r.teardown.observed = true;
    r.teardown.began_s = static_cast<double>(teardown->t_ns) / 1e9;
    absl::flat_hash_map<SiteKey, SiteTotals> after;
    for (const auto& [key, totals] : live) after.emplace(key, totals);
    for (const auto& [key, then] : teardown->sites) {
      const SiteTotals now = after.contains(key) ? after[key] : SiteTotals{};
      if (then.bytes <= now.bytes && then.count <= now.count) continue;
      SiteTotals& f = shutdown_freed[key];
      f.bytes = then.bytes > now.bytes ? then.bytes - now.bytes : 0;
      f.count = then.count > now.count ? then.count - now.count : 0;
      r.teardown.freed_bytes += f.bytes;
      r.teardown.freed_count += f.count;
    }
    live = teardown->sites;
  }
  for (const DeviceSource& d : in.devices) {
    const int ordinal = d.ledger->ordinal();
    const CounterSnapshot& c = now.devices[static_cast<size_t>(ordinal)];
    DeviceReport dr;
    dr.device = ordinal;
    dr.set_figures(c.figures());
    dr.pool = now.pools[static_cast<size_t>(ordinal)];
    if (teardown && static_cast<size_t>(ordinal) < teardown->devices.size()) {
      dr.live_bytes = teardown->devices[ordinal].live_bytes;
      dr.live_count = teardown->devices[ordinal].live_count;
      const PoolFigures& then = teardown->pools[ordinal];
      dr.pool.requested_bytes = then.requested_bytes;
      dr.pool.reserved_bytes = then.reserved_bytes;
      dr.pool.cached_free_bytes = then.cached_free_bytes;
      dr.pool.quarantined_bytes = then.quarantined_bytes;
      dr.pool.largest_free_block = then.largest_free_block;
      dr.pool.mapped_bytes = then.mapped_bytes;
    }
    dr.peak_allocated_at_s =
        c.peak_time_ns > in.start_ns ? static_cast<double>(c.peak_time_ns - in.start_ns) / 1e9 : 0;
    dr.failed_allocs = c.failed_allocs;
    dr.injected_failures = d.ledger->injected_failures();
    dr.resets = d.resets;
    dr.context_destroys = d.context_destroys;
    dr.capacity_bytes = d.capacity;
    dr.limit_bytes = d.ledger->budget().limit();
    dr.peak_reserved_bytes = dr.pool.peak_reserved_bytes;
    // At exit, as a trace of the run ends: its memory_summary() equals the trace's.
    dr.torch = d.ledger->torch_figures();
    add_driver_usage(in, ordinal, &dr);
    r.devices.push_back(dr);
  }
  const std::pair<const char*, MemoryKind> others[] = {{"managed", MemoryKind::kManaged},
                                                        {"host", MemoryKind::kHost},
                                                        {"graph", MemoryKind::kGraph},
                                                        {"imported", MemoryKind::kImported}};
  for (const auto& [name, kind] : others) {
    const CounterSnapshot c = in.books->counters(kind, -1)->snapshot();
    if (c.total_allocs == 0) continue;
    OtherMemoryReport o;
    o.kind = name;
    o.set_figures(c);
    r.other_memory.push_back(std::move(o));
  }
  // Sites whose stacks symbolize identically (a loop the compiler peeled or unrolled has several
  // return addresses on one source line) are one site to a reader: merge them.
  Symbolizer& sym = *in.symbolizer;
  const StackTable& stacks = *in.stacks;
  r.python = in.python_status;
  const bool torch_cache = !in.torch_cache_reason.empty();
  std::vector<uint64_t> words;
  absl::flat_hash_map<std::string, size_t> by_frames;
  for (const auto& [key, totals] : live) {
    stacks.frames(key.stack, &words);
    const auto freed = shutdown_freed.find(key);
    const SiteTotals gone = freed == shutdown_freed.end() ? SiteTotals{} : freed->second;
    std::vector<FrameInfo> frames;
    for (uint64_t w : words) frames.push_back(sym.resolve(w));
    auto [it, fresh] = by_frames.emplace(site_identity(key.device, memory_kind_name(key.kind), frames), r.sites.size());
    if (!fresh) {
      SiteReport& s = r.sites[it->second];
      s.live_bytes += totals.bytes;
      s.live_count += totals.count;
      s.shutdown_freed_bytes += gone.bytes;
      s.shutdown_freed_count += gone.count;
      s.stack_id = std::min(s.stack_id, key.stack);
      continue;
    }
    SiteReport s = site_report(key, totals, std::move(frames));
    s.shutdown_freed_bytes = gone.bytes;
    s.shutdown_freed_count = gone.count;
    s.owner = owner_of(s.frames, torch_cache);
    r.sites.push_back(std::move(s));
  }
  std::sort(r.sites.begin(), r.sites.end(), largest_site_first);
  r.growth = judge_growth(in.history->series(), in.evidence, [&](const SiteKey& key) {
    stacks.frames(key.stack, &words);
    std::vector<FrameInfo> frames;
    for (uint64_t w : words) frames.push_back(sym.resolve(w));
    return frames;
  });
  // PyTorch's cache, when the user's setting kept it in charge: one line, and its segments named
  // as such (their growth is still judged: a cache that keeps growing is worth knowing about).
  bool saw_torch_cache = false;
  for (const SiteReport& s : r.sites) saw_torch_cache = saw_torch_cache || !s.owner.empty();
  for (GrowthSuspectReport& g : r.growth.suspects) {
    g.owner = owner_of(g.frames, torch_cache);
    saw_torch_cache = saw_torch_cache || !g.owner.empty();
  }
  if (saw_torch_cache)
    r.torch_cache = "PyTorch's caching allocator is in charge (" + in.torch_cache_reason +
                    "): the shim sees its segments, not the program's tensors; unset it (GPUSHIM_TORCH_ALLOC=async) "
                    "to see every tensor at its line";
  for (const auto& [key, totals] : in.freed_by_reset) {
    stacks.frames(key.stack, &words);
    std::vector<FrameInfo> frames;
    for (uint64_t w : words) frames.push_back(sym.resolve(w));
    r.freed_by_reset.push_back(site_report(key, totals, std::move(frames)));
  }
  std::sort(r.freed_by_reset.begin(), r.freed_by_reset.end(), largest_site_first);
  for (const Sample& s : in.timeline)
    r.timeline.push_back({static_cast<double>(s.t_ns) / 1e9, s.device, s.allocated, s.reserved});
  {
    for (const OomRecord& o : in.ooms) {
      OomReport out;
      out.t_s = static_cast<double>(o.t_ns) / 1e9;
      out.device = o.device;
      out.requested = o.requested;
      const DeviceSource* d = nullptr;
      for (const DeviceSource& s : in.devices)
        if (s.ledger->ordinal() == o.device) d = &s;
      out.capacity = d ? d->capacity : 0;
      out.limit = d ? d->ledger->budget().limit() : 0;
      out.device_free = o.device_free;
      out.allocated = o.allocated;
      out.reserved = o.pool.reserved_bytes;
      out.cached_free = o.pool.cached_free_bytes;
      out.largest_free_block = o.pool.largest_free_block;
      out.cuda_pools_kept = o.pool.cuda_pools_kept_bytes;
      stacks.frames(o.stack, &words);
      for (uint64_t w : words) out.frames.push_back(sym.resolve(w));
      for (const auto& [stack, totals] : o.top_sites) {
        SiteReport s;
        s.device = o.device;
        s.live_bytes = totals.bytes;
        s.live_count = totals.count;
        s.stack_id = stack;
        stacks.frames(stack, &words);
        for (uint64_t w : words) s.frames.push_back(sym.resolve(w));
        out.top_sites.push_back(std::move(s));
      }
      out.injected = o.injected;
      out.advice = o.injected ? "Failed on purpose by GPUSHIM_FAIL=" + in.fail_spec +
                                    "; the device was not short of memory."
                              : oom_advice(out, r.policy);
      if (!o.injected)
        if (const std::string hint = oom_growth_hint(out, r.growth); !hint.empty()) out.advice += " " + hint;
      r.ooms.push_back(std::move(out));
    }
  }
  r.invalid_frees = in.invalid_frees;
  r.distinct_stacks = stacks.size();
  r.shim_host_bytes = in.host_bytes;
  add_modules(in, now, &r);
  return r;
}


}  // namespace gpushim
