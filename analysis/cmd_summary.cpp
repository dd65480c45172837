// gpushim-analyze summary: the human report of one run (report or trace).
#include <algorithm>
#include <cinttypes>
#include <map>
#include <optional>

#include "stacks/frame_roles.h"
#include "cli.h"
#include "json.h"
#include "offline_symbolizer.h"
#include "run_view.h"
#include "summary_views.h"
#include "torch_summary.h"
#include "util/paths.h"
#include "util/text.h"

namespace gpushim::analysis {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// The user's own line first, then its callers (stacks/frame_roles.h); the JSON keeps every frame.
std::vector<std::string> shown_frames(const std::vector<FrameInfo>& frames, size_t max) {
  std::vector<std::string> out;
  for (size_t i : frames_to_show(frames, max).indices) out.push_back(describe_frame(frames[i]));
  if (out.empty()) out.push_back(frames.empty() ? "(no stack captured)" : "(only CUDA runtime frames)");
  return out;
}

// For the first `top` of `rows` listed together, the frames that tell apart those whose shown
// frames are alike (stacks/frame_roles.h).
template <typename Rows, typename FramesOf>
std::vector<std::vector<size_t>> telling(const Rows& rows, size_t top, size_t max, FramesOf frames_of) {
  std::vector<const std::vector<FrameInfo>*> stacks;
  for (size_t i = 0; i < rows.size() && i < top; ++i) stacks.push_back(&frames_of(rows[i]));
  return telling_frames(stacks, max);
}

// The module a site is charged to: its innermost frame outside the shim and the CUDA runtime.
std::string charged_module(const std::vector<FrameInfo>& frames) {
  for (const FrameInfo& f : frames) {
    if (is_plumbing_frame(f)) continue;
    if (f.python) return f.file.empty() ? "(python)" : file_name_of(f.file);
    if (!f.module.empty()) return file_name_of(f.module);
  }
  return "(unknown)";
}

struct ModuleRow {
  uint64_t live = 0, at_peak = 0, sites = 0;
};

// The report's own definitions (report_model.h), so the summary and the report agree.
double utilization(const DeviceReport& d) { return derive(d).utilization; }

void json_frames(std::string* j, const std::vector<FrameInfo>& frames, size_t max) {
  *j += "[";
  bool first = true;
  for (const std::string& f : shown_frames(frames, max)) {
    if (!first) *j += ",";
    first = false;
    append_json_string(j, f);
  }
  *j += "]";
}

std::string num(uint64_t v) { return std::to_string(v); }
std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

int run_summary(const Cli& cli) {
  std::string err;
  const size_t top = cli.count("--top");
  const size_t max_frames = cli.count("--frames");
  const std::string format = cli.has("--json") ? "json" : cli.text("--format");
  const double temporary_ms = cli.number("--temporary-ms");
  const size_t site_no = cli.count("--site");
  // Options that ask for two different outputs are refused before the input is read: the text
  // tree of --site was printed whatever --json or --format asked for, and --json outranked
  // --format torch.
  if (cli.has("--json") && cli.has("--format") && cli.text("--format") != "json")
    return usage_error("summary", "--json and --format " + cli.text("--format") + " ask for two outputs");
  if (site_no != 0 && format != "text")
    return usage_error("summary", "--site prints a text tree: it does not go with " +
                                      (cli.has("--json") ? std::string("--json") : "--format " + format));
  RunView run;
  // What only the events can tell (per-allocation lifetimes, totals in bytes) comes from the same
  // reading of the trace.
  std::optional<TraceData> trace_data;
  if (!load_run(cli.operands[0], &run, &err, &trace_data)) {
    std::fprintf(stderr, "gpushim-analyze summary: %s\n", err.c_str());
    return 1;
  }
  if (format == "torch" && site_no == 0) {
    // torch's table has no place for them: what the reader noticed (a trace cut short) goes to stderr.
    for (const std::string& n : run.notes) std::fprintf(stderr, "gpushim-analyze summary: note: %s\n", n.c_str());
    return print_output("summary", torch_summary(run, trace_data ? &*trace_data : nullptr));
  }
  const ReportData& m = run.meta;
  std::map<std::string, ModuleRow> modules;
  for (const SiteView& s : run.sites) {
    ModuleRow& r = modules[charged_module(s.frames)];
    r.live += s.live_bytes;
    r.at_peak += s.at_device_peak_bytes;
    ++r.sites;
  }
  std::vector<std::pair<std::string, ModuleRow>> module_rows(modules.begin(), modules.end());
  const bool trace = run.source == "trace";
  std::sort(module_rows.begin(), module_rows.end(), [&](const auto& a, const auto& b) {
    const uint64_t ka = trace ? a.second.at_peak : a.second.live, kb = trace ? b.second.at_peak : b.second.live;
    return ka != kb ? ka > kb : a.second.live > b.second.live;
  });
  std::vector<const SiteView*> at_peak;
  for (const SiteView& s : run.sites)
    if (s.at_device_peak_bytes) at_peak.push_back(&s);
  std::sort(at_peak.begin(), at_peak.end(),
            [](const SiteView* a, const SiteView* b) { return a->at_device_peak_bytes > b->at_device_peak_bytes; });
  std::vector<const SiteView*> live;
  for (const SiteView& s : run.sites)
    if (s.live_bytes) live.push_back(&s);

  if (site_no) {
    const bool by_peak = run.source == "trace";
    const std::vector<const SiteView*>& list = by_peak ? at_peak : live;
    if (site_no > list.size()) {
      std::fprintf(stderr, "gpushim-analyze summary: --site %zu: the summary lists %zu sites %s\n", site_no, list.size(),
                   by_peak ? "at peak allocated" : "live at the end");
      return 1;
    }
    std::string o = "gpushim summary of " + run.source + " " + run.path + ": site #" + std::to_string(site_no) +
                    (by_peak ? " at peak allocated" : " live at the end") + "\n";
    o += site_tree(run, *list[site_no - 1], by_peak, std::max<size_t>(max_frames, 2) * 2);
    return print_output("summary", o);
  }
  AllocationRankings rankings;
  if (trace_data) rankings = rank_allocations(*trace_data, temporary_ms);
  std::vector<const AllocationRank*> most, temporary;
  for (const AllocationRank& r : rankings.sites) {
    most.push_back(&r);
    if (r.temporary) temporary.push_back(&r);
  }
  std::sort(most.begin(), most.end(), [](const AllocationRank* a, const AllocationRank* b) {
    return a->allocs != b->allocs ? a->allocs > b->allocs : a->bytes > b->bytes;
  });
  std::sort(temporary.begin(), temporary.end(), [](const AllocationRank* a, const AllocationRank* b) {
    return a->temporary != b->temporary ? a->temporary > b->temporary : a->temporary_bytes > b->temporary_bytes;
  });

  if (format == "json") {
    const bool trace = run.source == "trace";
    std::string j;
    append_run_header_json(&j, run);
    j += ",\"devices\":[";
    for (size_t i = 0; i < m.devices.size(); ++i) {
      const DeviceReport& d = m.devices[i];
      j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(d.device) +
           ",\"peak_allocated\":" + num(d.peak_bytes) + ",\"peak_allocated_at_s\":" + num(d.peak_allocated_at_s) +
           ",\"peak_reserved\":" + num(d.peak_reserved_bytes) + ",\"utilization\":" + num(utilization(d)) +
           ",\"live_bytes\":" + num(d.live_bytes) + ",\"live_count\":" + num(d.live_count) +
           ",\"reserved\":" + num(d.pool.reserved_bytes) + ",\"cached_free\":" + num(d.pool.cached_free_bytes) +
           // A trace records no pool's free list: its largest free block is unknown, not 0 (which
           // would make the external fragmentation 100%).
           ",\"largest_free_block\":" + (trace ? std::string("null") : num(d.pool.largest_free_block)) +
           ",\"external_fragmentation\":" +
           (trace ? std::string("null") : num(derive(d).external_fragmentation)) +
           ",\"internal_waste_bytes\":" + num(derive(d).internal_waste_bytes) + ",\"total_allocs\":" + num(d.total_allocs) +
           ",\"total_frees\":" + num(d.total_frees) + ",\"failed_allocs\":" + num(d.failed_allocs) +
           ",\"capacity\":" + num(d.capacity_bytes) + ",\"limit\":" + num(d.limit_bytes) + "}";
    }
    // A row whose frames show alike another's also says the frame that tells them apart.
    auto json_via = [&](const std::vector<FrameInfo>& frames, const std::vector<size_t>& via) {
      if (via.empty()) return;
      j += ",\"via\":[";
      for (size_t k = 0; k < via.size(); ++k) {
        if (k) j += ",";
        append_json_string(&j, describe_frame(frames[via[k]]));
      }
      j += "]";
    };
    j += "],\"top_sites\":[";
    const auto live_via = telling(live, top, max_frames, [](const SiteView* s) -> const auto& { return s->frames; });
    for (size_t i = 0; i < live.size() && i < top; ++i) {
      const SiteView& s = *live[i];
      j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(s.device) + ",\"kind\":";
      append_json_string(&j, s.kind);
      j += ",\"live_bytes\":" + num(s.live_bytes) + ",\"live_count\":" + num(s.live_count);
      if (s.has_history) j += ",\"peak_bytes\":" + num(s.peak_bytes) + ",\"at_peak_bytes\":" + num(s.at_device_peak_bytes);
      j += ",\"frames\":";
      json_frames(&j, s.frames, max_frames);
      json_via(s.frames, live_via[i]);
      j += "}";
    }
    j += "],\"at_peak_sites\":[";
    const auto via = telling(at_peak, top, max_frames, [](const SiteView* s) -> const auto& { return s->frames; });
    for (size_t i = 0; i < at_peak.size() && i < top; ++i) {
      const SiteView& s = *at_peak[i];
      j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(s.device) +
           ",\"at_peak_bytes\":" + num(s.at_device_peak_bytes) + ",\"frames\":";
      json_frames(&j, s.frames, max_frames);
      json_via(s.frames, via[i]);
      j += "}";
    }
    j += "],\"growth_known\":" + std::string(run.growth_known ? "true" : "false") + ",\"growth_verdict\":";
    append_json_string(&j, run.growth_verdict);
    j += ",\"growth_evidence\":";
    append_json_string(&j, run.growth_evidence);
    j += ",\"growth\":[";
    for (size_t i = 0; i < run.growth.size() && i < top; ++i) {
      const GrowthSuspect& g = run.growth[i];
      j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(g.device) + ",\"grew_bytes\":" + num(g.grew_bytes) +
           ",\"bytes_per_s\":" + num(g.bytes_per_s) + ",\"bytes_per_iteration\":" + num(g.bytes_per_iteration) +
           ",\"live_bytes\":" + num(g.live_bytes) + ",\"live_count\":" + num(g.live_count) +
           ",\"checkpoints\":" + std::to_string(g.checkpoints) + ",\"frames\":";
      json_frames(&j, g.frames, max_frames);
      j += "}";
    }
    j += "],\"modules\":[";
    for (size_t i = 0; i < module_rows.size(); ++i) {
      j += i ? "," : "";
      j += "{\"module\":";
      append_json_string(&j, module_rows[i].first);
      j += ",\"live_bytes\":" + num(module_rows[i].second.live) + ",\"at_peak_bytes\":" + num(module_rows[i].second.at_peak) +
           ",\"sites\":" + num(module_rows[i].second.sites) + "}";
    }
    j += "],\"ooms\":[";
    for (size_t i = 0; i < m.ooms.size(); ++i) {
      const OomReport& o = m.ooms[i];
      // A trace's events say neither the largest free block nor whether GPUSHIM_FAIL failed the
      // call: null there, not a figure.
      j += std::string(i ? "," : "") + "{\"t_s\":" + num(o.t_s) + ",\"device\":" + std::to_string(o.device) +
           ",\"requested\":" + num(o.requested) + ",\"allocated\":" + num(o.allocated) + ",\"reserved\":" + num(o.reserved) +
           ",\"cached_free\":" + num(o.cached_free) + ",\"largest_free_block\":" +
           (run.source == "report" ? num(o.largest_free_block) : std::string("null")) +
           ",\"device_free\":" + num(o.device_free) + ",\"injected\":" +
           (run.source != "report" ? "null" : o.injected ? "true" : "false") + ",\"advice\":";
      append_json_string(&j, o.advice);
      j += ",\"frames\":";
      json_frames(&j, o.frames, max_frames);
      j += "}";
    }
    auto ranked = [&](const char* name, const std::vector<const AllocationRank*>& list) {
      j += std::string("],\"") + name + "\":[";
      for (size_t i = 0; i < list.size() && i < top; ++i) {
        const AllocationRank& r = *list[i];
        j += std::string(i ? "," : "") + "{\"device\":" + std::to_string(r.device) + ",\"kind\":";
        append_json_string(&j, r.kind);
        j += ",\"allocs\":" + num(r.allocs) + ",\"bytes\":" + num(r.bytes) + ",\"temporary\":" + num(r.temporary) +
             ",\"temporary_bytes\":" + num(r.temporary_bytes) + ",\"frames\":";
        json_frames(&j, r.frames, max_frames);
        j += "}";
      }
    };
    ranked("most_allocations", most);
    ranked("temporary_allocations", temporary);
    j += "],\"temporary_ms\":" + num(temporary_ms);
    // A report counts its marks in its growth section (null when a site's iterations count too).
    j += ",\"iterations\":" + (run.iteration_marks ? num(*run.iteration_marks) : std::string("null")) +
         ",\"notes\":[";
    for (size_t i = 0; i < run.notes.size(); ++i) {
      j += i ? "," : "";
      append_json_string(&j, run.notes[i]);
    }
    j += "]}\n";
    return print_output("summary", j);
  }

  std::string o;
  auto line = [&](const std::string& s) { o += s + "\n"; };
  // A row's shown frames, and the frame that tells it from a row listed beside it that shows alike.
  auto frame_lines = [&](const std::vector<FrameInfo>& frames, const std::vector<size_t>& via) {
    for (const std::string& f : shown_frames(frames, max_frames)) line("      at " + f);
    std::string l;
    for (size_t k : via) l += (l.empty() ? "      via " : " -> ") + describe_frame(frames[k]);
    if (!l.empty()) line(l);
  };
  line("gpushim summary of " + run.source + " " + run.path);
  line("  " + printable(m.exe) + " (pid " + std::to_string(m.pid) + (m.rank.empty() ? "" : ", rank " + printable(m.rank)) +
       (m.host.empty() ? "" : ", host " + printable(m.host)) + "), policy " + printable(m.policy) + ", " +
       (m.reason == "snapshot" ? "snapshot" : m.reason == "exit" ? "exited" : m.reason) + " after " +
       fmt("%.2f", m.duration_s) + " s" +
       (run.iteration_marks.value_or(0) == 0 ? "" : ", " + std::to_string(*run.iteration_marks) + " iteration marks"));
  for (const std::string& n : run.notes) line("  note: " + n);

  // The moment a report's live figures describe: a Python program's are those of the start of its
  // interpreter's teardown (its frees, and so total_frees, go on to the end), a snapshot's its own.
  const std::string moment = m.reason == "snapshot"   ? "at the snapshot"
                             : m.teardown.observed ? "when the teardown began"
                                                   : "at the end";
  line("");
  line("Devices");
  for (const DeviceReport& d : m.devices) {
    line("  device " + std::to_string(d.device) + ": peak allocated " + human_bytes(d.peak_bytes) + " at " +
         fmt("%.2f", d.peak_allocated_at_s) + " s, peak reserved " + human_bytes(d.peak_reserved_bytes) +
         ", utilization " + fmt("%.1f", 100 * utilization(d)) + "% (fragmentation " +
         fmt("%.1f", 100 * (1 - utilization(d))) + "%)");
    std::string l2 = "            live " + moment + " " + human_bytes(d.live_bytes) + " in " +
                     plural(d.live_count, "allocation") + "; " + plural(d.total_allocs, "alloc") + ", " +
                     plural(d.total_frees, "free") + ", " + std::to_string(d.failed_allocs) + " failed";
    if (d.capacity_bytes) l2 += "; capacity " + human_bytes(d.capacity_bytes);
    if (d.limit_bytes) l2 += ", cap " + human_bytes(d.limit_bytes);
    line(l2);
  }
  // Without this, allocs - frees (counted to the end) disagrees with the live count.
  if (m.teardown.observed && m.reason != "snapshot")
    line("  the teardown began at " + fmt("%.2f", m.teardown.began_s) + " s and then freed " +
         human_bytes(m.teardown.freed_bytes) + " in " + plural(m.teardown.freed_count, "allocation") +
         ", still counted live above; the frees above include them");

  line("");
  line("Fragmentation");
  for (const DeviceReport& d : m.devices) {
    std::string l = "  device " + std::to_string(d.device) + ": peak reserved - peak allocated = " +
                    human_bytes(d.peak_reserved_bytes - std::min(d.peak_reserved_bytes, d.peak_bytes)) +
                    "; " + moment + " reserved " +
                    human_bytes(d.pool.reserved_bytes) + ", of it cached free " +
                    human_bytes(d.pool.cached_free_bytes);
    if (d.pool.largest_free_block)
      l += " (largest free block " + human_bytes(d.pool.largest_free_block) + ", external fragmentation " +
           fmt("%.0f", 100 * derive(d).external_fragmentation) + "%)";
    // Quarantined memory waits for the work queued before its free (events the pool queries without
    // waiting), not for a synchronization: the pools synchronize only when memory is short.
    if (d.pool.quarantined_bytes)
      l += ", quarantined until the work queued before its free is done " + human_bytes(d.pool.quarantined_bytes);
    if (derive(d).internal_waste_bytes)
      l += "; rounding waste in live blocks " + human_bytes(derive(d).internal_waste_bytes);
    line(l);
  }

  if (!m.ooms.empty()) {
    line("");
    line("Out of memory (" + std::to_string(m.ooms.size()) + ")");
    // What the report holds of each, as the shim's own summary gives it: whether GPUSHIM_FAIL
    // failed it on purpose, the cached free memory and the largest free block (a trace's events
    // give the cached free memory only), and the advice. Without them an injected failure read as
    // a real one, with nothing to act on.
    for (const OomReport& oom : m.ooms) {
      std::string cached = "cached free " + human_bytes(oom.cached_free);
      if (run.source == "report") cached += ", largest free block " + human_bytes(oom.largest_free_block);
      line("  at " + fmt("%.3f", oom.t_s) + " s on device " + std::to_string(oom.device) +
           (oom.injected ? " (injected by GPUSHIM_FAIL)" : "") + ": requested " + human_bytes(oom.requested) +
           "; allocated " + human_bytes(oom.allocated) + ", reserved " + human_bytes(oom.reserved) + " (" + cached +
           "), device free " + human_bytes(oom.device_free) + (oom.limit ? ", cap " + human_bytes(oom.limit) : ""));
      if (!oom.advice.empty()) line("      advice: " + printable(oom.advice));
      for (const std::string& f : shown_frames(oom.frames, max_frames)) line("      at " + f);
    }
  }

  line("");
  line("Growth suspects");
  if (!run.growth_known) line("  (unknown: this " + run.source + " carries no growth information)");
  else if (!run.growth_not_judged.empty()) line("  not judged: " + run.growth_not_judged);
  else if (run.growth.empty()) line("  none: no site's live memory rose steadily through the run");
  const auto growth_via = telling(run.growth, top, max_frames, [](const GrowthSuspect& g) -> const auto& { return g.frames; });
  for (size_t i = 0; i < run.growth.size() && i < top; ++i) {
    const GrowthSuspect& g = run.growth[i];
    std::string l = "  #" + std::to_string(i + 1) + " grew " + human_bytes(g.grew_bytes);
    if (g.bytes_per_iteration > 0)
      l += " (" + human_bytes(static_cast<uint64_t>(g.bytes_per_iteration)) + " per " + run.growth_unit + ")";
    if (g.bytes_per_s > 0) l += ", " + human_bytes(static_cast<uint64_t>(g.bytes_per_s)) + "/s";
    l += "; live " + human_bytes(g.live_bytes) + " in " + plural(g.live_count, "allocation") + ", device " +
         std::to_string(g.device);
    line(l);
    frame_lines(g.frames, growth_via[i]);
  }

  if (!at_peak.empty()) {
    line("");
    line("Top sites at peak allocated (what to cut to lower the peak)");
    const auto via = telling(at_peak, top, max_frames, [](const SiteView* s) -> const auto& { return s->frames; });
    for (size_t i = 0; i < at_peak.size() && i < top; ++i) {
      const SiteView& s = *at_peak[i];
      line("  #" + std::to_string(i + 1) + " " + human_bytes(s.at_device_peak_bytes) + " at the peak of device " +
           std::to_string(s.device) + " (site peak " + human_bytes(s.peak_bytes) + ", " +
           plural(s.total_allocs, "allocation") + " over the run)");
      frame_lines(s.frames, via[i]);
    }
  }

  line("");
  line("Top sites live " + moment);
  if (live.empty()) line("  none: everything was freed");
  const auto live_via = telling(live, top, max_frames, [](const SiteView* s) -> const auto& { return s->frames; });
  for (size_t i = 0; i < live.size() && i < top; ++i) {
    const SiteView& s = *live[i];
    line("  #" + std::to_string(i + 1) + " " + human_bytes(s.live_bytes) + " in " + plural(s.live_count, "allocation") + " (" + (s.kind == "device" ? "device " + std::to_string(s.device) : s.kind + " memory") + ")");
    frame_lines(s.frames, live_via[i]);
  }
  if (live.size() > top) {
    uint64_t rest = 0;
    for (size_t i = top; i < live.size(); ++i) rest += live[i]->live_bytes;
    line("  ... " + std::to_string(live.size() - top) + " more sites holding " + human_bytes(rest));
  }

  line("");
  line("Most allocations");
  if (!trace_data) line("  (traces only: a report counts what is live, not every allocation; record one with GPUSHIM_TRACE)");
  const auto most_via = telling(most, top, max_frames, [](const AllocationRank* r) -> const auto& { return r->frames; });
  for (size_t i = 0; i < most.size() && i < top; ++i) {
    const AllocationRank& r = *most[i];
    line("  #" + std::to_string(i + 1) + " " + plural(r.allocs, "allocation") + ", " + human_bytes(r.bytes) +
         " in all (" + (r.kind == "device" ? "device " + std::to_string(r.device) : r.kind + " memory") + ")");
    frame_lines(r.frames, most_via[i]);
  }
  if (trace_data) {
    line("");
    line("Temporary allocations (freed within " + fmt("%g", temporary_ms) + " ms" +
         (rankings.by_iteration ? " or in the iteration that made them)" : ")"));
    if (temporary.empty()) line("  none");
    const auto via = telling(temporary, top, max_frames, [](const AllocationRank* r) -> const auto& { return r->frames; });
    for (size_t i = 0; i < temporary.size() && i < top; ++i) {
      const AllocationRank& r = *temporary[i];
      line("  #" + std::to_string(i + 1) + " " + std::to_string(r.temporary) + " temporary of " +
           plural(r.allocs, "allocation") + " (" + fmt("%.0f", 100.0 * static_cast<double>(r.temporary) /
                                                                     static_cast<double>(std::max<uint64_t>(1, r.allocs))) +
           "%), " + human_bytes(r.temporary_bytes) + " (" +
           (r.kind == "device" ? "device " + std::to_string(r.device) : r.kind + " memory") + ")");
      frame_lines(r.frames, via[i]);
    }
  }

  line("");
  line("Modules (innermost frame outside the shim and the CUDA runtime)");
  char head[160];
  std::snprintf(head, sizeof(head), "  %-36s %14s %14s %6s", "module", "live", trace ? "at peak" : "", "sites");
  line(head);
  for (const auto& [name, r] : module_rows) {
    char row[256];
    std::snprintf(row, sizeof(row), "  %-36s %14s %14s %6" PRIu64, name.substr(0, 36).c_str(), human_bytes(r.live).c_str(),
                  trace ? human_bytes(r.at_peak).c_str() : "", r.sites);
    line(row);
  }
  return print_output("summary", o);
}

}  // namespace

const CommandSpec kSummaryCommand{
    .name = "summary",
    .operands = "REPORT|TRACE",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "the human report: peaks, fragmentation, OOMs, growth suspects, top sites, per-module table",
    .description = R"(The human report of one run, from a JSON report (exit or snapshot) or a trace:
  - per device: peak allocated and when, peak reserved, utilization (peak allocated / peak
    reserved) and fragmentation, live memory at the end, OOMs;
  - fragmentation: reserved but unallocated memory at the end, largest free block;
  - out-of-memory events: the request, the memory then allocated, reserved and cached free (and,
    from a report, the largest free block), whether GPUSHIM_FAIL injected it, the report's
    advice, and the failing call's stack;
  - growth: the verdict (suspects, none, or not judged with its evidence) and the sites whose live
    memory rose steadily through the run (reports: the report's growth section; traces: the same
    verdict, recomputed by the shim's own code over the checkpoints the trace records);
  - top sites: live at the end, and for traces also what each held at the device's peak;
  - per-module table: bytes by the innermost module outside the shim and the CUDA runtime;
  - traces: the sites with the most allocations, and with the most temporary allocations (freed
    within --temporary-ms, or before the next iteration mark), as heaptrack ranks them.
)",
    .options =
        {
            {.name = "--top",
             .kind = ValueKind::kCount,
             .value_name = "N",
             .help = "sites and suspects shown",
             .fallback = "10",
             .min = 1,
             .max = 1e9},
            {.name = "--frames",
             .kind = ValueKind::kCount,
             .value_name = "N",
             .help = "frames shown per site (frames of the shim and the CUDA runtime are skipped)",
             .fallback = "6",
             .min = 1,
             .max = 1e6},
            {.name = "--json", .help = "machine-readable output instead of text (the same as --format json)"},
            {.name = "--format",
             .kind = ValueKind::kChoice,
             .value_name = "F",
             .help = "what to print:",
             .fallback = "text",
             .choices =
                 {
                     {"text", "the summary above"},
                     {"json", "the same, machine-readable"},
                     {"torch",
                      "PyTorch 2's torch.cuda.memory_summary() table per device (its 11 blocks, units and counts; "
                      "a trace fills every cell, a report those its counters hold, n/a the rest), then the shim's "
                      "own rows in a block below it: cached free memory, largest free block, syncs, peak time, "
                      "duration, unaccounted memory"},
                 }},
            {.name = "--temporary-ms",
             .kind = ValueKind::kNumber,
             .value_name = "N",
             .help = "an allocation freed within N ms is temporary",
             .fallback = "10",
             .min = 0,
             .max = 1e9},
            {.name = "--site",
             .kind = ValueKind::kCount,
             .value_name = "N",
             .help = "the callers and callees of site #N of the first site list (traces: \"Top sites at peak "
                     "allocated\"; reports: \"Top sites live at the end\"): every path through the function it "
                     "allocates from, with bytes and allocation counts (text only)",
             .min = 1,
             .max = 1e6},
        },
    .run = run_summary,
};

}  // namespace gpushim::analysis
