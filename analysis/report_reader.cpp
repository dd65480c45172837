#include "report_reader.h"

#include <cmath>

#include "json.h"
#include "util/text.h"

namespace gpushim::analysis {
namespace {

// Reads fields of one JSON object into C++ values. Missing optional fields keep their defaults
// (older and newer shims write subsets and supersets); a present field of the wrong type is an
// error naming its path.
class Fields {
 public:
  Fields(const JsonValue& obj, std::string path, std::string* error) : obj_(obj), path_(std::move(path)), error_(error) {}

  bool ok() const { return ok_; }

  void u64(const char* key, uint64_t* out, bool required = false) {
    const JsonValue* v = find(key, required);
    if (v && !v->to_u64(out)) fail(key, "expected an unsigned integer");
  }
  void u32(const char* key, uint32_t* out) {
    uint64_t v = *out;
    u64(key, &v);
    if (ok_ && v > UINT32_MAX) fail(key, "out of range");
    if (ok_) *out = static_cast<uint32_t>(v);
  }
  void integer(const char* key, int* out) {
    const JsonValue* v = find(key, false);
    if (!v) return;
    int64_t i = 0;
    if (!v->to_i64(&i) || i < INT32_MIN || i > INT32_MAX) return fail(key, "expected an integer");
    *out = static_cast<int>(i);
  }
  // Every number of seconds a report holds is from the shim's start or the epoch: negative, or
  // past any real run (1e10 s, 317 years), it is damage, and in nanoseconds it would not fit the
  // exports' 64-bit timestamps.
  void seconds(const char* key, double* out) {
    const JsonValue* v = find(key, false);
    if (!v || v->is_null()) return;  // NaN and infinities are written as null
    double d = 0;
    if (!v->to_double(&d)) return fail(key, "expected a number");
    if (!(d >= 0 && d <= 1e10)) return fail(key, "expected seconds from 0 to 1e10");
    *out = d;
  }
  void boolean(const char* key, bool* out) {
    const JsonValue* v = find(key, false);
    if (!v) return;
    if (!v->is_bool()) return fail(key, "expected true or false");
    *out = v->boolean();
  }
  void str(const char* key, std::string* out, bool required = false) {
    const JsonValue* v = find(key, required);
    if (!v) return;
    if (!v->is_string()) return fail(key, "expected a string");
    *out = v->str();
  }
  // The array at `key` (null when absent and optional).
  const JsonValue* array(const char* key, bool required = false) {
    const JsonValue* v = find(key, required);
    if (v && !v->is_array()) {
      fail(key, "expected an array");
      return nullptr;
    }
    return v;
  }
  const JsonValue* object(const char* key) {
    const JsonValue* v = find(key, false);
    if (v && !v->is_object()) {
      fail(key, "expected an object");
      return nullptr;
    }
    return v;
  }
  std::string path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  const JsonValue* find(const char* key, bool required) {
    if (!ok_) return nullptr;
    const JsonValue* v = obj_.get(key);
    if (!v && required) fail(key, "missing");
    return v;
  }
  void fail(const char* key, const char* what) {
    if (!ok_) return;
    ok_ = false;
    if (error_) *error_ = path(key) + ": " + what;
  }

  const JsonValue& obj_;
  const std::string path_;
  std::string* error_;
  bool ok_ = true;
};

std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

bool need_object(const JsonValue& v, const std::string& path, std::string* error) {
  if (v.is_object()) return true;
  *error = path + ": expected an object";
  return false;
}

bool read_frame(const JsonValue& v, const std::string& path, FrameInfo* f, std::string* error) {
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  r.str("function", &f->function);
  r.str("file", &f->file);
  r.integer("line", &f->line);
  r.str("module", &f->module);
  r.u64("address", &f->address);
  r.u64("module_offset", &f->module_offset);
  std::string kind = "native";
  r.str("kind", &kind);
  f->python = kind == "python";
  return r.ok();
}

bool read_frames(Fields& r, const std::string& base, std::vector<FrameInfo>* out, std::string* error) {
  const JsonValue* frames = r.array("frames");
  if (!r.ok()) return false;
  if (!frames) return true;
  for (size_t i = 0; i < frames->items().size(); ++i) {
    FrameInfo f;
    if (!read_frame(frames->items()[i], at(base + ".frames", i), &f, error)) return false;
    out->push_back(std::move(f));
  }
  return true;
}

bool read_site(const JsonValue& v, const std::string& path, SiteReport* s, std::string* error) {
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  r.integer("device", &s->device);
  r.str("kind", &s->kind);
  r.u64("live_bytes", &s->live_bytes);
  r.u64("live_count", &s->live_count);
  r.u32("stack_id", &s->stack_id);
  return r.ok() && read_frames(r, path, &s->frames, error);
}

bool read_pool(const JsonValue& v, const std::string& path, PoolFigures* p, std::string* error) {
  Fields r(v, path, error);
  r.u64("requested_bytes", &p->requested_bytes);
  r.u64("peak_requested_bytes", &p->peak_requested_bytes);
  r.u64("reserved_bytes", &p->reserved_bytes);
  r.u64("peak_reserved_bytes", &p->peak_reserved_bytes);
  r.u64("cached_free_bytes", &p->cached_free_bytes);
  r.u64("quarantined_bytes", &p->quarantined_bytes);
  r.u64("largest_free_block", &p->largest_free_block);
  r.u64("segment_allocs", &p->segment_allocs);
  r.u64("segment_frees", &p->segment_frees);
  r.u64("alloc_retries", &p->alloc_retries);
  r.u64("ooms", &p->ooms);
  r.u64("reuse_syncs", &p->reuse_syncs);
  r.u64("reuse_waits", &p->reuse_waits);
  r.u64("map_calls", &p->map_calls);
  r.u64("unmap_calls", &p->unmap_calls);
  r.u64("mapped_bytes", &p->mapped_bytes);
  return r.ok();
}

bool read_stat(const JsonValue& v, const std::string& path, torch_stats::Values* s, std::string* error) {
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  r.u64("current", &s->current);
  r.u64("peak", &s->peak);
  r.u64("allocated", &s->allocated);
  r.u64("freed", &s->freed);
  return r.ok();
}

// The "torch" object of a device (shims from issue 31 on): metric -> pool -> stat. A metric the
// shim did not keep is absent (inactive_split where the pool does not place its blocks).
bool read_torch(const JsonValue& v, const std::string& path, torch_stats::Figures* f, std::string* error) {
  using namespace torch_stats;
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  for (int m = 0; m < kMetrics; ++m) {
    const JsonValue* metric = r.object(metric_name(m));
    if (!r.ok()) return false;
    if (metric == nullptr) {
      if (m == kInactiveSplit || m == kInactiveSplitBytes) f->split_known = false;
      continue;
    }
    Fields pools(*metric, r.path(metric_name(m)), error);
    for (int p = 0; p < kPools; ++p) {
      const JsonValue* stat = pools.object(pool_name(p));
      if (!pools.ok()) return false;
      if (stat && !read_stat(*stat, pools.path(pool_name(p)), &f->stat[m][p], error)) return false;
    }
  }
  for (auto [name, out] : {std::pair<const char*, Values*>{"oversize_allocations", &f->oversize_allocations},
                           {"oversize_segments", &f->oversize_segments}}) {
    const JsonValue* stat = r.object(name);
    if (!r.ok()) return false;
    if (stat && !read_stat(*stat, r.path(name), out, error)) return false;
  }
  return r.ok();
}

bool read_device(const JsonValue& v, const std::string& path, DeviceReport* d, std::string* error) {
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  r.integer("device", &d->device);
  r.u64("live_bytes", &d->live_bytes);
  r.u64("live_count", &d->live_count);
  r.u64("peak_allocated_bytes", &d->peak_bytes);
  r.seconds("peak_allocated_at_s", &d->peak_allocated_at_s);
  r.u64("peak_reserved_bytes", &d->peak_reserved_bytes);
  r.u64("total_allocs", &d->total_allocs);
  r.u64("total_frees", &d->total_frees);
  r.u64("failed_allocs", &d->failed_allocs);
  r.u64("capacity_bytes", &d->capacity_bytes);
  r.u64("limit_bytes", &d->limit_bytes);
  r.u64("injected_failures", &d->injected_failures);
  d->usage_at_s = std::nan("");  // null: the driver's usage was never sampled
  r.seconds("usage_at_s", &d->usage_at_s);
  d->usage_sampled = !std::isnan(d->usage_at_s);
  if (!d->usage_sampled) d->usage_at_s = 0;
  r.u64("driver_used_bytes", &d->driver_used_bytes);
  r.u64("held_bytes", &d->held_bytes);
  r.u64("unaccounted_bytes", &d->unaccounted_bytes);
  const JsonValue* pool = r.object("pool");
  const JsonValue* torch = r.object("torch");
  if (!r.ok()) return false;
  if (torch != nullptr && !read_torch(*torch, r.path("torch"), &d->torch.emplace(), error)) return false;
  return pool == nullptr || read_pool(*pool, r.path("pool"), &d->pool, error);
}

bool read_oom(const JsonValue& v, const std::string& path, OomReport* o, std::string* error) {
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  r.seconds("t_s", &o->t_s);
  r.integer("device", &o->device);
  r.u64("requested", &o->requested);
  r.u64("capacity", &o->capacity);
  r.u64("limit", &o->limit);
  r.u64("device_free", &o->device_free);
  r.u64("allocated", &o->allocated);
  r.u64("reserved", &o->reserved);
  r.u64("cached_free", &o->cached_free);
  r.u64("largest_free_block", &o->largest_free_block);
  r.str("advice", &o->advice);
  r.boolean("injected", &o->injected);
  if (!r.ok() || !read_frames(r, path, &o->frames, error)) return false;
  const JsonValue* tops = r.array("top_sites");
  if (!r.ok()) return false;
  if (tops) {
    for (size_t i = 0; i < tops->items().size(); ++i) {
      SiteReport s;
      if (!read_site(tops->items()[i], at(path + ".top_sites", i), &s, error)) return false;
      o->top_sites.push_back(std::move(s));
    }
  }
  return true;
}

bool read_growth(const JsonValue& v, const std::string& path, GrowthEntry* g, std::string* error) {
  if (!need_object(v, path, error)) return false;
  Fields r(v, path, error);
  r.integer("device", &g->device);
  if (!r.ok() || !read_frames(r, path, &g->frames, error)) return false;
  for (const auto& [key, value] : v.members()) {
    double d = 0;
    if (key != "device" && value.to_double(&d)) g->figures[key] = d;
  }
  return true;
}

// Reads the array at `key` element by element with `fn`.
template <typename T, typename Fn>
bool read_list(Fields& top, const char* key, bool required, std::vector<T>* out, Fn fn, std::string* error) {
  const JsonValue* arr = top.array(key, required);
  if (!top.ok()) return false;
  if (!arr) return true;
  for (size_t i = 0; i < arr->items().size(); ++i) {
    T item{};
    if (!fn(arr->items()[i], at(key, i), &item, error)) return false;
    out->push_back(std::move(item));
  }
  return true;
}

}  // namespace

bool parse_report(const std::string& bytes, ReportFile* out, std::string* error) {
  std::string ignored;
  if (!error) error = &ignored;
  JsonValue doc;
  bool ended_early = false;
  if (!parse_json(bytes, &doc, error, &ended_early)) {
    // A report that stops mid-document was cut while written or copied: the parser's "unexpected
    // end of input" (or "missing closing quote") at some line and column does not say so.
    if (ended_early && bytes.find_first_not_of(" \t\r\n") != std::string::npos)
      *error = "the report is cut short, after " + std::to_string(bytes.size()) + (bytes.size() == 1 ? " byte (" : " bytes (") +
               *error + ")";
    return false;
  }
  if (!doc.is_object()) {
    *error = "not a gpushim report: the document is not a JSON object";
    return false;
  }
  ReportFile file;
  ReportData& r = file.report;
  Fields top(doc, "", error);
  top.str("schema", &r.schema, true);
  if (!top.ok()) {
    *error = "not a gpushim report (" + *error + ")";
    return false;
  }
  constexpr std::string_view kPrefix = "gpushim-report/";
  if (r.schema.rfind(kPrefix, 0) != 0) {
    *error = "not a gpushim report: schema is '" + excerpt(r.schema) + "'";
    return false;
  }
  const std::string major = r.schema.substr(kPrefix.size(), r.schema.find('.', kPrefix.size()) - kPrefix.size());
  if (major != "1") {
    *error = "unsupported report schema '" + excerpt(r.schema) + "' (this tool reads gpushim-report/1)";
    return false;
  }
  r.version.clear();  // reports from before 0.9.0 have none
  top.str("version", &r.version);
  top.integer("pid", &r.pid);
  top.str("exe", &r.exe);
  top.str("host", &r.host);
  top.str("rank", &r.rank);
  top.str("policy", &r.policy);
  top.str("reason", &r.reason);
  top.seconds("wall_time_s", &r.wall_time_s);
  top.seconds("duration_s", &r.duration_s);
  top.integer("stack_depth", &r.stack_depth);
  top.u64("invalid_frees", &r.invalid_frees);
  top.u64("distinct_stacks", &r.distinct_stacks);
  top.u64("shim_host_bytes", &r.shim_host_bytes);
  // Reports before 0.9.0 have no teardown: then the figures are those of the exit.
  if (const JsonValue* t = top.object("teardown")) {
    Fields f(*t, top.path("teardown"), error);
    f.boolean("observed", &r.teardown.observed);
    f.seconds("began_s", &r.teardown.began_s);
    f.u64("freed_bytes", &r.teardown.freed_bytes);
    f.u64("freed_count", &r.teardown.freed_count);
    if (!f.ok()) return false;
  }
  if (!top.ok()) return false;
  if (!read_list(top, "devices", true, &r.devices, read_device, error)) return false;
  // The shim writes each device once; a report that lists one twice is not one run's (merge summed
  // both entries, and every figure of the device doubled).
  for (size_t i = 0; i < r.devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (r.devices[j].device == r.devices[i].device) {
        *error = top.path("devices") + "[" + std::to_string(i) + "]: device " + std::to_string(r.devices[i].device) +
                 " is listed twice (also devices[" + std::to_string(j) + "])";
        return false;
      }
  if (!read_list(top, "sites", true, &r.sites, read_site, error)) return false;
  if (!read_list(top, "ooms", false, &r.ooms, read_oom, error)) return false;
  if (!read_list(
          top, "other_memory", false, &r.other_memory,
          [](const JsonValue& v, const std::string& path, OtherMemoryReport* o, std::string* err) {
            if (!need_object(v, path, err)) return false;
            Fields f(v, path, err);
            f.str("kind", &o->kind);
            f.u64("live_bytes", &o->live_bytes);
            f.u64("live_count", &o->live_count);
            f.u64("peak_bytes", &o->peak_bytes);
            f.u64("total_allocs", &o->total_allocs);
            f.u64("total_frees", &o->total_frees);
            return f.ok();
          },
          error))
    return false;
  if (!read_list(
          top, "timeline", false, &r.timeline,
          [](const JsonValue& v, const std::string& path, TimelineSample* t, std::string* err) {
            if (!need_object(v, path, err)) return false;
            Fields f(v, path, err);
            f.seconds("t_s", &t->t_s);
            f.integer("device", &t->device);
            f.u64("allocated", &t->allocated);
            f.u64("reserved", &t->reserved);
            return f.ok();
          },
          error))
    return false;
  // The growth section belongs to a newer part of the shim; its exact shape may vary (a list, or an
  // object holding one). Read what is recognizable and never refuse a report over it.
  if (const JsonValue* growth = doc.get("growth")) {
    file.has_growth = true;
    if (const JsonValue* v = growth->get("verdict"); v && v->is_string()) file.growth_verdict = v->str();
    if (const JsonValue* v = growth->get("evidence"); v && v->is_string()) file.growth_evidence = v->str();
    if (const JsonValue* v = growth->get("steps_per_pattern")) v->to_u64(&file.growth_steps_per_pattern);
    const JsonValue* source = growth->get("iteration_source");
    uint64_t iterations = 0;
    if (source && source->is_string() && source->str() == "none") file.iteration_marks = 0;
    if (const JsonValue* v = growth->get("iterations");
        v && source && source->is_string() && source->str() == "marks" && v->to_u64(&iterations))
      file.iteration_marks = iterations;
    const JsonValue* list = growth->is_array() ? growth : nullptr;
    for (const auto& [key, value] : growth->members())
      if (!list && value.is_array()) list = &value;
    std::string ignored_error;
    for (size_t i = 0; list && i < list->items().size(); ++i) {
      GrowthEntry g;
      if (read_growth(list->items()[i], at("growth", i), &g, &ignored_error)) file.growth.push_back(std::move(g));
    }
  }
  *out = std::move(file);
  return true;
}

}  // namespace gpushim::analysis
