// The short human summary printed at exit. The JSON report is the complete record; this is what
// someone reads in a scrolled-by terminal, so it names sizes in human units and shows only the
// frames that point at the program rather than at the CUDA runtime or the shim.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string_view>

#include "report/growth_verdict.h"
#include "report/report_writer.h"
#include "stacks/frame_roles.h"
#include "util/no_write_signals.h"
#include "util/paths.h"
#include "util/text.h"
#include "util/units.h"

namespace gpushim {
namespace {

// Frames shown per site; the report keeps all of them.
constexpr size_t kFramesShown = 6;
// Out-of-memory events shown; the report keeps all it recorded.
constexpr size_t kOomsShown = 3;
// Modules named per device; the report keeps all of them.
constexpr size_t kModulesShown = 4;

void append(std::string* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void append(std::string* s, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (static_cast<size_t>(n) < sizeof(buf)) {
    s->append(buf, static_cast<size_t>(n));
    return;
  }
  std::string big(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  s->append(big.data(), static_cast<size_t>(n));
}

void append_frame(std::string* s, const FrameInfo& f) {
  if (f.python) {
    const std::string fn = f.function.empty() ? "<unknown>" : printable(f.function);
    if (!f.file.empty())
      append(s, "gpushim:       at %s (%s:%d)\n", fn.c_str(), printable(base_name(f.file)).c_str(), f.line);
    else
      append(s, "gpushim:       at %s\n", fn.c_str());
    return;
  }
  std::string line = "gpushim:       at ";
  if (!f.function.empty())
    line += printable(f.function);
  else
    append(&line, "0x%" PRIx64, f.address);
  if (!f.file.empty()) {
    line += ' ';
    line += printable(base_name(f.file));
    if (f.line > 0) append(&line, ":%d", f.line);
  }
  if (!f.module.empty()) {
    line += " (";
    line += printable(base_name(f.module));
    if (f.function.empty()) append(&line, "+0x%" PRIx64, f.module_offset);
    line += ')';
  }
  line += '\n';
  *s += line;
}

// The frames of one stack that say who allocated: the user's own line first (stacks/frame_roles.h).
// `via`: the frames that tell this stack from another listed beside it that shows alike
// (telling_frames).
void append_stack(std::string* s, const std::vector<FrameInfo>& frames, const std::vector<size_t>& via = {}) {
  const ShownFrames shown = frames_to_show(frames, kFramesShown);
  for (size_t i : shown.indices) append_frame(s, frames[i]);
  // The framework context the user's line called into, folded to a count.
  if (!shown.indices.empty() && shown.library_inside > 0)
    append(s, "gpushim:         (%s called from the first line, folded)\n",
           plural(shown.library_inside, "library frame").c_str());
  for (size_t k = 0; k < via.size(); ++k) {
    std::string line;
    append_frame(&line, frames[via[k]]);  // "gpushim:       at F\n"
    *s += (k == 0 ? "gpushim:       via" : "gpushim:        ->") + line.substr(line.find(" at ") + 3);
  }
  if (shown.indices.empty())
    append(s, "gpushim:       %s\n", frames.empty() ? "(no stack captured)" : "(only CUDA runtime frames)");
}

// Growth suspects come before what is merely live at exit: they are what a person should fix.
void append_growth(std::string* s, const GrowthReport& g, size_t max_sites) {
  const size_t shown = g.suspects.size() < max_sites ? g.suspects.size() : max_sites;
  if (g.verdict == "not judged") append(s, "gpushim: growth: not judged, %s\n", printable(g.evidence).c_str());
  if (shown == 0) return;
  const char* unit = growth_unit(g.steps_per_pattern);
  std::string pattern;
  if (g.steps_per_pattern > 1) pattern = ", pattern repeats every " + std::to_string(g.steps_per_pattern) + " steps";
  append(s, "gpushim: growth suspects (live memory that grew steadily; %s sampled%s%s%s):\n",
         plural(g.samples, "instant").c_str(), g.iterations ? ", " : "",
         g.iterations ? plural(g.iterations, unit).c_str() : "", pattern.c_str());
  std::vector<const std::vector<FrameInfo>*> stacks;
  for (size_t i = 0; i < shown; ++i) stacks.push_back(&g.suspects[i].frames);
  const std::vector<std::vector<size_t>> via = telling_frames(stacks, kFramesShown);
  for (size_t i = 0; i < shown; ++i) {
    const GrowthSuspectReport& gs = g.suspects[i];
    std::string rate = format_bytes(static_cast<uint64_t>(gs.bytes_per_s > 0 ? gs.bytes_per_s : 0)) + "/s";
    if (!std::isnan(gs.bytes_per_iteration))
      rate = format_bytes(static_cast<uint64_t>(gs.bytes_per_iteration > 0 ? gs.bytes_per_iteration : 0)) +
             " per " + unit + ", " + rate;
    std::string where = gs.kind == "device" ? "device " + std::to_string(gs.device) : printable(gs.kind) + " memory";
    if (!gs.owner.empty()) where += ", " + printable(gs.owner);
    append(s, "gpushim:   #%zu +%s over %.2f s (%s); live %s in %s (%s)\n", i + 1, format_bytes(gs.growth_bytes).c_str(),
           gs.last_s - gs.first_s, rate.c_str(), format_bytes(gs.live_bytes).c_str(),
           plural(gs.live_count, "allocation").c_str(), where.c_str());
    append_stack(s, gs.frames, via[i]);
  }
  if (g.suspects.size() > shown)
    append(s, "gpushim:   ... %s more in the report\n", plural(g.suspects.size() - shown, "suspect").c_str());
}

}  // namespace

std::string sample_vs_peak(const DeviceReport& d) {
  const double delta = d.usage_at_s - d.peak_allocated_at_s;
  if (std::fabs(delta) < 0.005)
    return d.held_bytes >= d.peak_reserved_bytes ? "at the peak" : "next to the peak in time, not in memory held";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f s %s the peak", std::fabs(delta), delta < 0 ? "before" : "after");
  return buf;
}

void write_summary(const ReportData& r, const std::string& json_path, size_t max_sites, FILE* out) {
  std::string s;
  append(&s, "gpushim: report for %s (pid %d, policy %s)\n", printable(r.exe).c_str(), r.pid,
         printable(r.policy).c_str());

  // A Python program's live figures are of the moment its interpreter began its teardown, while
  // the alloc and free totals run to the end (gpushim-analyze summary words it the same way).
  const bool at_teardown = r.teardown.observed && r.teardown.freed_count != 0;
  const char* live_when = at_teardown ? "live when the teardown began" : "live";
  for (const DeviceReport& d : r.devices) {
    append(&s,
           "gpushim: device %d: %s %s in %s, peak allocated %s at %.2f s, peak reserved %s, %s, %s, "
           "%" PRIu64 " failed",
           d.device, live_when, format_bytes(d.live_bytes).c_str(), plural(d.live_count, "allocation").c_str(),
           format_bytes(d.peak_bytes).c_str(), d.peak_allocated_at_s,
           format_bytes(d.peak_reserved_bytes).c_str(), plural(d.total_allocs, "alloc").c_str(),
           plural(d.total_frees, "free").c_str(), d.failed_allocs);
    if (d.pool.cached_free_bytes != 0) append(&s, ", cached %s", format_bytes(d.pool.cached_free_bytes).c_str());
    if (d.limit_bytes != 0) append(&s, ", cap %s", format_bytes(d.limit_bytes).c_str());
    // What torch.cuda.memory_summary() users look for: driver segments and allocations retried
    // after the pool gave its cache back (passthrough has neither). Under vmm the pool's driver
    // allocations are physical ones (cuMemCreate), mapped side by side: the torch table's segments
    // are their runs of adjacent mappings, so these are not called segments here.
    const bool physical = r.policy == "vmm";
    if (d.pool.segment_allocs != 0 || d.pool.alloc_retries != 0)
      append(&s, ", %s held (%" PRIu64 " %s, %" PRIu64 " %s), %s",
             plural(d.pool.segment_allocs - std::min(d.pool.segment_allocs, d.pool.segment_frees),
                    physical ? "physical allocation" : "segment")
                 .c_str(),
             d.pool.segment_allocs, physical ? "created" : "taken", d.pool.segment_frees,
             physical ? "released" : "given back", plural(d.pool.alloc_retries, "retry", "retries").c_str());
    s += '\n';
  }
  for (const OtherMemoryReport& o : r.other_memory) {
    if (o.total_allocs == 0) continue;
    append(&s, "gpushim: %s memory: live %s in %s, peak %s, %s, %s\n", printable(o.kind).c_str(),
           format_bytes(o.live_bytes).c_str(), plural(o.live_count, "allocation").c_str(),
           format_bytes(o.peak_bytes).c_str(), plural(o.total_allocs, "alloc").c_str(),
           plural(o.total_frees, "free").c_str());
  }
  for (const DeviceReport& d : r.devices) {
    // Who holds the device memory, by library: the question "where did my memory go" starts here.
    std::string line;
    size_t shown = 0, more = 0;
    uint64_t more_bytes = 0;
    for (const ModuleReport& m : r.modules) {
      if (m.kind != "device" || m.device != d.device || m.live_bytes == 0) continue;
      if (shown == kModulesShown) {
        ++more;
        more_bytes += m.live_bytes;
        continue;
      }
      append(&line, "%s%s %s", shown++ ? ", " : "", printable(base_name(m.module)).c_str(),
             format_bytes(m.live_bytes).c_str());
    }
    if (more) append(&line, ", %s holding %s", plural(more, "more module").c_str(), format_bytes(more_bytes).c_str());
    if (!line.empty()) append(&s, "gpushim: device %d live by module: %s\n", d.device, line.c_str());
    if (d.usage_sampled)
      append(&s,
             "gpushim: device %d unaccounted: %s (the driver reported %s in use at %.2f s, %s, of which the "
             "process held %s; the rest is context, module images and other memory no call returns)\n",
             d.device, format_bytes(d.unaccounted_bytes).c_str(), format_bytes(d.driver_used_bytes).c_str(),
             d.usage_at_s, sample_vs_peak(d).c_str(),
             format_bytes(d.held_bytes).c_str());
  }
  for (size_t i = 0; i < r.ooms.size() && i < kOomsShown; ++i) {
    const OomReport& o = r.ooms[i];
    append(&s,
           "gpushim: out of memory on device %d at %.2f s: requested %s; allocated %s, reserved %s (cached %s, "
           "largest free block %s), device free %s of %s",
           o.device, o.t_s, format_bytes(o.requested).c_str(), format_bytes(o.allocated).c_str(),
           format_bytes(o.reserved).c_str(), format_bytes(o.cached_free).c_str(),
           format_bytes(o.largest_free_block).c_str(), format_bytes(o.device_free).c_str(),
           format_bytes(o.capacity).c_str());
    if (o.limit != 0) append(&s, ", cap %s", format_bytes(o.limit).c_str());
    if (o.injected) s += " (failed on purpose: GPUSHIM_FAIL)";
    s += '\n';
    // Where it failed: the line a user fixes first (the program's, before CUDA's and the shim's).
    if (!o.frames.empty()) append_stack(&s, o.frames);
    if (!o.advice.empty()) append(&s, "gpushim:   advice: %s\n", printable(o.advice).c_str());
  }
  if (r.ooms.size() > kOomsShown)
    append(&s, "gpushim: ... %s more out-of-memory events in the report\n",
           std::to_string(r.ooms.size() - kOomsShown).c_str());
  for (const DeviceReport& d : r.devices) {
    if (d.resets == 0 && d.context_destroys == 0) continue;
    uint64_t bytes = 0, count = 0;
    for (const SiteReport& site : r.freed_by_reset)
      if (site.device == d.device) bytes += site.live_bytes, count += site.live_count;
    // A program that freed everything before its reset or release did nothing to point at.
    if (count == 0) continue;
    std::string what;
    if (d.resets != 0) what = "was reset " + plural(d.resets, "time");
    if (d.context_destroys != 0)
      what += (what.empty() ? "had " : " and had ") + plural(d.context_destroys, "context") + " destroyed";
    append(&s, "gpushim: device %d %s; that freed %s in %s still live (freed_by_reset in the report)\n",
           d.device, what.c_str(), format_bytes(bytes).c_str(), plural(count, "allocation").c_str());
  }
  if (r.invalid_frees != 0)
    append(&s, "gpushim: %s of pointers the shim did not hand out\n", plural(r.invalid_frees, "free").c_str());

  if (at_teardown)
    append(&s,
           "gpushim: the Python interpreter's teardown began at %.2f s and then freed %s in %s (object "
           "finalizers), still counted live above and below; the frees above include them\n",
           r.teardown.began_s, format_bytes(r.teardown.freed_bytes).c_str(),
           plural(r.teardown.freed_count, "allocation").c_str());
  if (!r.torch_cache.empty()) append(&s, "gpushim: %s\n", printable(r.torch_cache).c_str());
  append_growth(&s, r.growth, max_sites);
  const size_t shown = r.sites.size() < max_sites ? r.sites.size() : max_sites;
  if (shown > 0)
    append(&s, at_teardown ? "gpushim: top allocation sites live when the teardown began:\n" : "gpushim: top live allocation sites:\n");
  std::vector<const std::vector<FrameInfo>*> stacks;
  for (size_t i = 0; i < shown; ++i) stacks.push_back(&r.sites[i].frames);
  const std::vector<std::vector<size_t>> via = telling_frames(stacks, kFramesShown);
  for (size_t i = 0; i < shown; ++i) {
    const SiteReport& site = r.sites[i];
    if (site.kind == "device")
      append(&s, "gpushim:   #%zu %s in %s (device %d%s%s)\n", i + 1, format_bytes(site.live_bytes).c_str(),
             plural(site.live_count, "allocation").c_str(), site.device, site.owner.empty() ? "" : ", ",
             printable(site.owner).c_str());
    else
      append(&s, "gpushim:   #%zu %s in %s (%s memory)\n", i + 1, format_bytes(site.live_bytes).c_str(),
             plural(site.live_count, "allocation").c_str(), printable(site.kind).c_str());
    if (site.shutdown_freed_count != 0)
      append(&s, "gpushim:       (%s of it freed during interpreter shutdown)\n",
             format_bytes(site.shutdown_freed_bytes).c_str());
    append_stack(&s, site.frames, via[i]);
  }
  if (r.sites.size() > shown) {
    uint64_t rest = 0;
    for (size_t i = shown; i < r.sites.size(); ++i) rest += r.sites[i].live_bytes;
    append(&s, "gpushim:   ... %s more holding %s\n", plural(r.sites.size() - shown, "site").c_str(),
           format_bytes(rest).c_str());
  }
  if (!json_path.empty()) append(&s, "gpushim: report written to %s\n", printable(json_path).c_str());

  // Built whole and written at once: on unbuffered stderr that is a single write(2), which lines
  // from other threads cannot split. Past the host's file-size limit it is lost, never the host.
  const ScopedNoWriteSignals no_write_signals;
  std::fwrite(s.data(), 1, s.size(), out);
  std::fflush(out);
}

}  // namespace gpushim
