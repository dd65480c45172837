// JSON rendering of the report, by hand: the shim must not pull a JSON library into every traced
// process. Field names and order are the schema (docs/report-format.md); keep them stable.
#include <charconv>
#include <cmath>
#include <cstring>

#include "report/report_writer.h"
#include "util/json_string.h"

namespace gpushim {
namespace {

class JsonOut {
 public:
  explicit JsonOut(std::string& out) : s(out) {}

  std::string& s;

  // Emits the separating comma when this is not the first member.
  void key(const char* k) {
    if (need_comma_) s += ',';
    s += '"';
    s += k;  // keys are our own ASCII identifiers: nothing to escape
    s += "\":";
    need_comma_ = true;
  }
  void begin(char c) {  // '{' or '['
    s += c;
    need_comma_ = false;
  }
  void end(char c) {
    s += c;
    need_comma_ = true;
  }
  // Starts a new line before the next member or element (after any pending comma), so the
  // document reads one device, one site header and one frame per line.
  void next_line(const char* indent) {
    if (need_comma_) s += ',';
    s += '\n';
    s += indent;
    need_comma_ = false;
  }

  void u64(uint64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    s.append(buf, r.ptr);
  }
  void i64(int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    s.append(buf, r.ptr);
  }
  // Shortest text that reads back as the same double; JSON has no NaN/inf, so those are null.
  void dbl(double v) {
    if (!std::isfinite(v)) {
      s += "null";
      return;
    }
    char buf[40];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    const size_t at = s.size();
    s.append(buf, r.ptr);
    // Keep doubles recognisable as such for readers that type by the first value they see.
    if (s.find_first_of(".eE", at) == std::string::npos) s += ".0";
  }
  void str(const std::string& v) { append_json_string(&s, v); }

  void kv(const char* k, uint64_t v) {
    key(k);
    u64(v);
  }
  void kv_int(const char* k, int64_t v) {
    key(k);
    i64(v);
  }
  void kv_dbl(const char* k, double v) {
    key(k);
    dbl(v);
  }
  void kv(const char* k, const std::string& v) {
    key(k);
    str(v);
  }
  void kv_bool(const char* k, bool v) {
    key(k);
    s += v ? "true" : "false";
  }

 private:
  bool need_comma_ = false;
};

void write_pool(JsonOut& j, const PoolFigures& p) {
  j.key("pool");
  j.begin('{');
  j.kv("requested_bytes", p.requested_bytes);
  j.kv("peak_requested_bytes", p.peak_requested_bytes);
  j.kv("reserved_bytes", p.reserved_bytes);
  j.kv("peak_reserved_bytes", p.peak_reserved_bytes);
  j.kv("cached_free_bytes", p.cached_free_bytes);
  j.kv("quarantined_bytes", p.quarantined_bytes);
  j.kv("largest_free_block", p.largest_free_block);
  j.kv("segment_allocs", p.segment_allocs);
  j.kv("segment_frees", p.segment_frees);
  j.kv("alloc_retries", p.alloc_retries);
  j.kv("ooms", p.ooms);
  j.kv("reuse_syncs", p.reuse_syncs);
  j.kv("reuse_waits", p.reuse_waits);
  j.kv("map_calls", p.map_calls);
  j.kv("unmap_calls", p.unmap_calls);
  j.kv("mapped_bytes", p.mapped_bytes);
  j.end('}');
}

void write_stat(JsonOut& j, const char* name, const torch_stats::Values& v) {
  j.key(name);
  j.begin('{');
  j.kv("current", v.current);
  j.kv("peak", v.peak);
  j.kv("allocated", v.allocated);
  j.kv("freed", v.freed);
  j.end('}');
}

// memory_stats()'s figures, nested as metric -> pool -> stat; the inactive_split ones only where
// they were kept.
void write_torch(JsonOut& j, const torch_stats::Figures& f) {
  using namespace torch_stats;
  j.key("torch");
  j.begin('{');
  for (int m = 0; m < kMetrics; ++m) {
    if (!f.split_known && (m == kInactiveSplit || m == kInactiveSplitBytes)) continue;
    j.key(metric_name(m));
    j.begin('{');
    for (int p = 0; p < kPools; ++p) write_stat(j, pool_name(p), f.stat[m][p]);
    j.end('}');
  }
  write_stat(j, "oversize_allocations", f.oversize_allocations);
  write_stat(j, "oversize_segments", f.oversize_segments);
  j.end('}');
}

void write_device(JsonOut& j, const DeviceReport& d) {
  j.begin('{');
  j.kv_int("device", d.device);
  j.kv("live_bytes", d.live_bytes);
  j.kv("live_count", d.live_count);
  j.kv("peak_allocated_bytes", d.peak_bytes);
  j.kv_dbl("peak_allocated_at_s", d.peak_allocated_at_s);
  j.kv("peak_reserved_bytes", d.peak_reserved_bytes);
  j.kv("total_allocs", d.total_allocs);
  j.kv("total_frees", d.total_frees);
  j.kv("failed_allocs", d.failed_allocs);
  j.kv("injected_failures", d.injected_failures);
  j.kv("resets", d.resets);
  j.kv("context_destroys", d.context_destroys);
  j.kv("capacity_bytes", d.capacity_bytes);
  j.kv("limit_bytes", d.limit_bytes);
  write_pool(j, d.pool);
  const DerivedFigures f = derive(d);
  j.kv_dbl("utilization", f.utilization);
  j.kv_dbl("external_fragmentation", f.external_fragmentation);
  j.kv("internal_waste_bytes", f.internal_waste_bytes);
  j.kv_dbl("usage_at_s", d.usage_sampled ? d.usage_at_s : std::nan(""));
  j.kv("driver_used_bytes", d.driver_used_bytes);
  j.kv("held_bytes", d.held_bytes);
  j.kv("unaccounted_bytes", d.unaccounted_bytes);
  if (d.torch) write_torch(j, *d.torch);
  j.end('}');
}

// The five figures as modules[] and other_memory[] name them (devices[] names the peak
// peak_allocated_bytes and writes its own).
void write_figures(JsonOut& j, const MemoryFigures& f) {
  j.kv("live_bytes", f.live_bytes);
  j.kv("live_count", f.live_count);
  j.kv("peak_bytes", f.peak_bytes);
  j.kv("total_allocs", f.total_allocs);
  j.kv("total_frees", f.total_frees);
}

void write_module(JsonOut& j, const ModuleReport& m) {
  j.begin('{');
  j.kv("module", m.module);
  j.kv_int("device", m.device);
  j.kv("kind", m.kind);
  write_figures(j, m);
  j.end('}');
}

void write_other(JsonOut& j, const OtherMemoryReport& o) {
  j.begin('{');
  j.kv("kind", o.kind);
  write_figures(j, o);
  j.end('}');
}

void write_frame(JsonOut& j, const FrameInfo& f) {
  j.begin('{');
  j.kv("function", f.function);
  j.kv("file", f.file);
  j.kv_int("line", f.line);
  j.kv("module", f.module);
  j.kv("address", f.address);
  j.kv("module_offset", f.module_offset);
  j.kv("kind", std::string(f.python ? "python" : "native"));
  j.end('}');
}

// Frames go one per line at `indent`: diffs and greps of reports stay readable.
void write_frames(JsonOut& j, const std::vector<FrameInfo>& frames, const char* indent) {
  j.key("frames");
  j.begin('[');
  for (const FrameInfo& f : frames) {
    j.next_line(indent);
    write_frame(j, f);
  }
  j.end(']');
}

void write_site_at(JsonOut& j, const SiteReport& site, const char* frame_indent) {
  j.begin('{');
  j.kv_int("device", site.device);
  j.kv("kind", site.kind);
  j.kv("live_bytes", site.live_bytes);
  j.kv("live_count", site.live_count);
  j.kv("stack_id", static_cast<uint64_t>(site.stack_id));
  j.kv("freed_during_shutdown_bytes", site.shutdown_freed_bytes);
  j.kv("freed_during_shutdown_count", site.shutdown_freed_count);
  j.kv("owner", site.owner);
  write_frames(j, site.frames, frame_indent);
  j.end('}');
}

void write_site(JsonOut& j, const SiteReport& site) { write_site_at(j, site, "   "); }

void write_sample(JsonOut& j, const TimelineSample& t) {
  j.begin('{');
  j.kv_dbl("t_s", t.t_s);
  j.kv_int("device", t.device);
  j.kv("allocated", t.allocated);
  j.kv("reserved", t.reserved);
  j.end('}');
}

void write_oom(JsonOut& j, const OomReport& o) {
  j.begin('{');
  j.kv_dbl("t_s", o.t_s);
  j.kv_int("device", o.device);
  j.kv("requested", o.requested);
  j.kv("capacity", o.capacity);
  j.kv("limit", o.limit);
  j.kv("device_free", o.device_free);
  j.kv("allocated", o.allocated);
  j.kv("reserved", o.reserved);
  j.kv("cached_free", o.cached_free);
  j.kv("largest_free_block", o.largest_free_block);
  j.kv("advice", o.advice);
  j.kv_bool("injected", o.injected);
  write_frames(j, o.frames, "   ");
  j.key("top_sites");
  j.begin('[');
  for (const SiteReport& site : o.top_sites) {
    j.next_line("   ");
    write_site_at(j, site, "    ");
  }
  j.end(']');
  j.end('}');
}

void write_suspect(JsonOut& j, const GrowthSuspectReport& g) {
  j.begin('{');
  j.kv_int("device", g.device);
  j.kv("kind", g.kind);
  j.kv("growth_bytes", g.growth_bytes);
  j.kv_dbl("bytes_per_s", g.bytes_per_s);
  j.kv_dbl("bytes_per_iteration", g.bytes_per_iteration);
  j.kv("iterations", g.iterations);
  j.kv("live_bytes", g.live_bytes);
  j.kv("live_count", g.live_count);
  j.kv("samples", g.samples);
  j.kv_dbl("first_s", g.first_s);
  j.kv_dbl("last_s", g.last_s);
  j.kv_dbl("trend", g.trend);
  j.kv("stack_id", static_cast<uint64_t>(g.stack_id));
  j.kv("owner", g.owner);
  write_frames(j, g.frames, "    ");
  j.end('}');
}

void write_growth(JsonOut& j, const GrowthReport& g) {
  j.key("growth");
  j.begin('{');
  j.kv("samples", g.samples);
  j.kv("iterations", g.iterations);
  j.kv("iteration_source", g.iteration_source);
  j.kv("detected_period", g.detected_period);
  j.kv("steps_per_pattern", g.steps_per_pattern);
  j.kv("step_function", g.step_function);
  j.kv("verdict", g.verdict);
  j.kv("evidence", g.evidence);
  j.key("suspects");
  j.begin('[');
  for (const GrowthSuspectReport& s : g.suspects) {
    j.next_line("   ");
    write_suspect(j, s);
  }
  j.end(']');
  j.end('}');
}

void write_teardown(JsonOut& j, const TeardownReport& t) {
  j.key("teardown");
  j.begin('{');
  j.kv_bool("observed", t.observed);
  j.kv_dbl("began_s", t.began_s);
  j.kv("freed_bytes", t.freed_bytes);
  j.kv("freed_count", t.freed_count);
  j.end('}');
}

// Writes `items` as an array with one element per line.
template <typename T, typename Fn>
void write_array(JsonOut& j, const char* name, const std::vector<T>& items, Fn fn) {
  j.key(name);
  j.begin('[');
  for (const T& item : items) {
    j.next_line(" ");
    fn(j, item);
  }
  j.end(']');
}

}  // namespace

std::string report_to_json(const ReportData& r) {
  std::string s;
  s.reserve(1024 + r.sites.size() * 512 + r.timeline.size() * 80);
  JsonOut j{s};
  j.begin('{');
  j.kv("schema", r.schema);
  j.kv("version", r.version);
  j.kv_int("pid", r.pid);
  j.kv("exe", r.exe);
  j.kv("host", r.host);
  j.kv("rank", r.rank);
  j.kv("policy", r.policy);
  j.kv("reason", r.reason);
  j.kv_dbl("wall_time_s", r.wall_time_s);
  j.kv_dbl("duration_s", r.duration_s);
  j.kv_int("stack_depth", r.stack_depth);
  j.kv("python", r.python);
  j.kv("torch_cache", r.torch_cache);
  j.next_line("");
  write_array(j, "devices", r.devices, write_device);
  j.next_line("");
  write_array(j, "other_memory", r.other_memory, write_other);
  j.next_line("");
  j.kv("invalid_frees", r.invalid_frees);
  j.kv("distinct_stacks", r.distinct_stacks);
  j.kv("shim_host_bytes", r.shim_host_bytes);
  j.kv("reserved_va_bytes", r.reserved_va_bytes);
  j.next_line("");
  write_array(j, "modules", r.modules, write_module);
  j.next_line("");
  write_array(j, "ooms", r.ooms, write_oom);
  j.next_line("");
  write_growth(j, r.growth);
  j.next_line("");
  write_teardown(j, r.teardown);
  j.next_line("");
  write_array(j, "sites", r.sites, write_site);
  j.next_line("");
  write_array(j, "freed_by_reset", r.freed_by_reset, write_site);
  // Last: with GPUSHIM_SAMPLE_MS it can be the longest part, and the rest should come first.
  j.next_line("");
  write_array(j, "timeline", r.timeline, write_sample);
  j.s += '\n';
  j.end('}');
  s += '\n';
  return s;
}

}  // namespace gpushim
