// gpushim-analyze diff: what changed between two runs, per device and per allocation site.
#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <map>
#include <tuple>

#include "stacks/frame_roles.h"
#include "cli.h"
#include "json.h"
#include "offline_symbolizer.h"
#include "run_view.h"

namespace gpushim::analysis {
namespace {

// b - a, saturated at int64's ends: the plain cast difference of figures past 2^63 (a damaged
// report's, within what the reader accepts) overflowed and printed the wrong sign.
int64_t delta(uint64_t a, uint64_t b) {
  if (b >= a) return b - a > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(b - a);
  return a - b > static_cast<uint64_t>(INT64_MAX) ? INT64_MIN : -static_cast<int64_t>(a - b);
}

// The same change for people, exact over the whole range ("+16.0 EiB", "-1.5 GiB", "0 B").
std::string change(uint64_t a, uint64_t b) {
  if (a == b) return "0 B";
  return b > a ? "+" + human_bytes(b - a) : "-" + human_bytes(a - b);
}

struct Row {
  const SiteView* a = nullptr;
  const SiteView* b = nullptr;
  // Per-site peaks are known only when both runs are traces: a report has none, and a site it does
  // not list had no live memory at its end, not a peak of 0 B.
  bool peaks = false;
  int64_t live_delta() const {
    return delta(a ? a->live_bytes : 0, b ? b->live_bytes : 0);
  }
  bool peak_known() const { return peaks && (!a || a->has_history) && (!b || b->has_history); }
  int64_t peak_delta() const {
    if (!peak_known()) return 0;
    return delta(a ? a->peak_bytes : 0, b ? b->peak_bytes : 0);
  }
  const char* status() const {
    // Without peaks, only live bytes compare: a site a report does not list had none live, so one
    // with no live bytes on either side is the same as far as both inputs know.
    if (!peak_known() && live_delta() == 0) return "same";
    if (!a) return "new";
    if (!b) return "gone";
    return live_delta() != 0 || (peak_known() && peak_delta() != 0) ? "changed" : "same";
  }
  const SiteView& any() const { return b ? *b : *a; }
};

uint64_t mag(int64_t v) { return v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v); }

// For the first `top` rows, the folded frames that tell apart rows whose shown frames are alike
// (stacks/frame_roles.h), as text.
template <typename Rows>
std::vector<std::vector<std::string>> vias_of(const Rows& rows, size_t top, size_t max) {
  std::vector<const std::vector<FrameInfo>*> stacks;
  for (size_t i = 0; i < rows.size() && i < top; ++i) stacks.push_back(&rows[i].any().frames);
  std::vector<std::vector<std::string>> out;
  const auto via = telling_frames(stacks, max);
  for (size_t i = 0; i < via.size(); ++i) {
    out.emplace_back();
    for (size_t k : via[i]) out.back().push_back(describe_frame((*stacks[i])[k]));
  }
  return out;
}

std::vector<std::string> frames_of(const SiteView& s, size_t max) {
  std::vector<std::string> out;
  for (size_t i : frames_to_show(s.frames, max).indices) out.push_back(describe_frame(s.frames[i]));
  if (out.empty()) out.push_back("(no stack captured)");
  return out;
}

// The one device a run allocated on, or -1 when it used none or several.
int only_device(const RunView& run) {
  int found = -1;
  for (const DeviceReport& d : run.meta.devices) {
    if (d.peak_bytes == 0) continue;
    if (found >= 0) return -1;
    found = d.device;
  }
  return found;
}

// Gives B's device `from` the ordinal `to` and the reverse, in what diff compares.
void swap_devices(RunView* run, int from, int to) {
  auto swapped = [&](int d) { return d == from ? to : d == to ? from : d; };
  for (DeviceReport& d : run->meta.devices) d.device = swapped(d.device);
  for (SiteView& s : run->sites) s.device = swapped(s.device);
}

int run_diff(const Cli& cli) {
  std::string err;
  const size_t top = cli.count("--top");
  RunView a, b;
  if (!load_run(cli.operands[0], &a, &err) || !load_run(cli.operands[1], &b, &err)) {
    std::fprintf(stderr, "gpushim-analyze diff: %s\n", err.c_str());
    return 1;
  }

  // Two ranks of one job each allocate on their own GPU (LOCAL_RANK picks it): compared by
  // ordinal, every site was "gone" from A's device and "new" on B's. Runs on one device each are
  // compared device with device; B's ordinals are given back in the output.
  const int device_a = only_device(a), device_b = only_device(b);
  const bool paired = device_a >= 0 && device_b >= 0 && device_a != device_b;
  if (paired) swap_devices(&b, device_b, device_a);
  auto b_ordinal = [&](int d) { return paired && d == device_a ? device_b : paired && d == device_b ? device_a : d; };

  // A report of a Python program counts live memory when the interpreter's teardown began; a
  // trace before format 1.5 after all that the teardown freed, which it has no mark of: one run's
  // report and trace differed by exactly that, every site "changed", with nothing to say why.
  // (A 1.5 trace says when the teardown began, and its live figures are of that moment too.)
  for (auto [report, other, name] : {std::tuple<RunView*, const RunView*, const char*>{&a, &b, "B"}, {&b, &a, "A"}}) {
    const TeardownReport& t = report->meta.teardown;
    if (report->source == "report" && other->source == "trace" && !other->meta.teardown.observed && t.observed &&
        t.freed_bytes > 0) {
      char when[32];
      std::snprintf(when, sizeof(when), "%.2f", t.began_s);
      report->notes.push_back(std::string("live memory is counted when the interpreter's teardown began (") + when +
                              " s; the teardown then freed " + human_bytes(t.freed_bytes) + "); " + name +
                              ", a trace, counts it after the teardown, so live figures do not compare");
    }
  }

  const bool peaks = a.source == "trace" && b.source == "trace";
  std::map<std::string, Row> by_id;
  for (const SiteView& s : a.sites) by_id[site_identity(s)].a = &s;
  for (const SiteView& s : b.sites) by_id[site_identity(s)].b = &s;
  for (auto& [id, row] : by_id) row.peaks = peaks;
  std::vector<Row> rows;
  for (const auto& [id, row] : by_id)
    if (cli.has("--all") || std::string(row.status()) != "same") rows.push_back(row);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
    if (mag(x.live_delta()) != mag(y.live_delta())) return mag(x.live_delta()) > mag(y.live_delta());
    return mag(x.peak_delta()) > mag(y.peak_delta());
  });

  std::map<int, std::pair<const DeviceReport*, const DeviceReport*>> devices;
  for (const DeviceReport& d : a.meta.devices) devices[d.device].first = &d;
  for (const DeviceReport& d : b.meta.devices) devices[d.device].second = &d;
  auto field = [](const DeviceReport* d, uint64_t DeviceReport::*f) -> uint64_t { return d ? d->*f : 0; };

  if (cli.has("--json")) {
    std::string j = "{\"a\":";
    append_json_string(&j, a.path);
    j += ",\"b\":";
    append_json_string(&j, b.path);
    for (const auto& [key, run] : {std::pair<const char*, const RunView*>{"notes_a", &a}, {"notes_b", &b}}) {
      j += std::string(",\"") + key + "\":[";
      for (size_t i = 0; i < run->notes.size(); ++i) {
        j += i ? "," : "";
        append_json_string(&j, run->notes[i]);
      }
      j += "]";
    }
    j += ",\"devices\":[";
    bool first = true;
    for (const auto& [ord, pair] : devices) {
      j += first ? "" : ",";
      first = false;
      j += "{\"device\":" + std::to_string(ord) + ",\"device_b\":" + std::to_string(b_ordinal(ord));
      j += std::string(",\"in_a\":") + (pair.first ? "true" : "false") + ",\"in_b\":" + (pair.second ? "true" : "false");
      using Field = uint64_t DeviceReport::*;  // members of DeviceReport and of its MemoryFigures alike
      for (auto [name, f] : {std::pair<const char*, Field>{"peak_allocated", &DeviceReport::peak_bytes},
                             std::pair<const char*, Field>{"peak_reserved", &DeviceReport::peak_reserved_bytes},
                             std::pair<const char*, Field>{"live", &DeviceReport::live_bytes}}) {
        const uint64_t va = field(pair.first, f), vb = field(pair.second, f);
        j += std::string(",\"") + name + "_a\":" + std::to_string(va) + ",\"" + name + "_b\":" + std::to_string(vb) +
             ",\"" + name + "_delta\":" + std::to_string(delta(va, vb));
      }
      j += "}";
    }
    j += "],\"sites\":[";
    const auto json_vias = vias_of(rows, top, 8);
    for (size_t i = 0; i < rows.size() && i < top; ++i) {
      const Row& r = rows[i];
      j += std::string(i ? "," : "") + "{\"status\":\"" + r.status() + "\",\"device\":" + std::to_string(r.any().device) +
           ",\"kind\":";
      append_json_string(&j, r.any().kind);
      j += ",\"live_a\":" + std::to_string(r.a ? r.a->live_bytes : 0) + ",\"live_b\":" +
           std::to_string(r.b ? r.b->live_bytes : 0) + ",\"live_delta\":" + std::to_string(r.live_delta());
      if (r.peak_known())
        j += ",\"peak_a\":" + std::to_string(r.a ? r.a->peak_bytes : 0) + ",\"peak_b\":" +
             std::to_string(r.b ? r.b->peak_bytes : 0) + ",\"peak_delta\":" + std::to_string(r.peak_delta());
      else
        j += ",\"peak_a\":null,\"peak_b\":null,\"peak_delta\":null";
      j += ",\"frames\":[";
      const auto fr = frames_of(r.any(), 8);
      for (size_t k = 0; k < fr.size(); ++k) {
        j += k ? "," : "";
        append_json_string(&j, fr[k]);
      }
      j += "]";
      if (!json_vias[i].empty()) {
        j += ",\"via\":[";
        for (size_t k = 0; k < json_vias[i].size(); ++k) {
          j += k ? "," : "";
          append_json_string(&j, json_vias[i][k]);
        }
        j += "]";
      }
      j += "}";
    }
    j += "]}\n";
    return print_output("diff", j);
  }

  std::string o = "gpushim diff\n  A: " + a.path + " (" + a.source + ", pid " + std::to_string(a.meta.pid) + ")\n  B: " +
                  b.path + " (" + b.source + ", pid " + std::to_string(b.meta.pid) + ")\n";
  // What the readers noticed (a trace cut short, events dropped) bounds what the figures below mean.
  for (const std::string& n : a.notes) o += "  note on A: " + n + "\n";
  for (const std::string& n : b.notes) o += "  note on B: " + n + "\n";
  if (paired)
    o += "  each run allocated on one device: A's device " + std::to_string(device_a) + " is compared with B's device " +
         std::to_string(device_b) + "\n";
  o += "\nDevices\n";
  for (const auto& entry : devices) {
    // Plain variables, not a structured binding: the lambda captures them, which C++20 compilers
    // before clang 16 reject for bindings.
    const int ord = entry.first;
    const auto& pair = entry.second;
    auto one = [&](const char* name, uint64_t DeviceReport::*f) {
      const uint64_t va = field(pair.first, f), vb = field(pair.second, f);
      return std::string(name) + " " + human_bytes(va) + " -> " + human_bytes(vb) + " (" +
             change(va, vb) + ")";
    };
    const int ord_b = b_ordinal(ord);
    // A device one run never used reads 0 B there: say so, rather than seem to have measured it.
    const char* only = pair.first == nullptr ? " (not used in A)" : pair.second == nullptr ? " (not used in B)" : "";
    o += "  device " + std::to_string(ord) + (ord_b != ord ? " (B: device " + std::to_string(ord_b) + ")" : "") + only +
         ": " + one("peak allocated", &DeviceReport::peak_bytes) + "; " +
         one("peak reserved", &DeviceReport::peak_reserved_bytes) + "; " + one("live", &DeviceReport::live_bytes) + "\n";
  }
  o += "\nSites (largest change first" + std::string(peaks ? "" : "; per-site peaks need two traces") + ")\n";
  if (rows.empty()) o += "  no site changed\n";
  const auto vias = vias_of(rows, top, 6);
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const Row& r = rows[i];
    std::string l = "  " + std::string(r.status()) + ": live " + human_bytes(r.a ? r.a->live_bytes : 0) + " -> " +
                    human_bytes(r.b ? r.b->live_bytes : 0) + " (" + change(r.a ? r.a->live_bytes : 0, r.b ? r.b->live_bytes : 0) + ")";
    if (r.peak_known())
      l += ", site peak " + human_bytes(r.a ? r.a->peak_bytes : 0) + " -> " + human_bytes(r.b ? r.b->peak_bytes : 0) + " (" +
           change(r.a ? r.a->peak_bytes : 0, r.b ? r.b->peak_bytes : 0) + ")";
    o += l + "\n";
    for (const std::string& f : frames_of(r.any(), 6)) o += "      at " + f + "\n";
    for (size_t k = 0; k < vias[i].size(); ++k) o += (k ? " -> " : "      via ") + vias[i][k] + (k + 1 == vias[i].size() ? "\n" : "");
  }
  if (rows.size() > top) o += "  ... " + std::to_string(rows.size() - top) + " more\n";
  return print_output("diff", o);
}

}  // namespace

const CommandSpec kDiffCommand{
    .name = "diff",
    .operands = "A B",
    .min_operands = 2,
    .max_operands = 2,
    .summary = "per-site change in live and peak bytes between two runs",
    .description = R"(Compares two runs (reports, snapshots or traces; A is the baseline):
  - per device: peak allocated, peak reserved and live memory at the end, and their change (two
    runs that each allocated on one device, such as two ranks on their own GPUs, are compared
    device with device whatever their ordinals);
  - per allocation site: live bytes at the end in A and B and the change, and (when both inputs
    are traces, which know each site's history) the site's peak live bytes and its change.
Sites are matched by their symbolized stacks (function, file, line, module name), so runs of
different processes and builds compare; a site only in B is "new", only in A "gone".
)",
    .options =
        {
            {.name = "--top",
             .kind = ValueKind::kCount,
             .value_name = "N",
             .help = "sites shown, largest change first",
             .fallback = "20",
             .min = 1,
             .max = 1e9},
            {.name = "--all", .help = "also list sites that did not change"},
            {.name = "--json", .help = "machine-readable output"},
        },
    .run = run_diff,
};

}  // namespace gpushim::analysis
