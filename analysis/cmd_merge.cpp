// gpushim-analyze merge: one table across the ranks (or processes) of a job, with outliers flagged.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "stacks/frame_roles.h"
#include "cli.h"
#include "gzip_input.h"
#include "json.h"
#include "offline_symbolizer.h"
#include "run_view.h"
#include "util/text.h"

namespace gpushim::analysis {
namespace {

struct RowData {
  RunView run;
  std::string label;
  // Sums over the run's devices, each device's own peak: what the run needed of its GPUs.
  uint64_t peak_allocated = 0, peak_reserved = 0, live = 0;
  int peak_device = 0;  // the device with the highest peak allocated
  size_t devices = 0;
  std::string suspect;  // one line
  std::string suspect_kind;  // "growth" or "live"
  std::vector<std::string> outliers;
  std::vector<std::string> also;  // other files of the same run (its trace, an earlier snapshot)
  bool has_inode = false;
  dev_t dev = 0;
  ino_t ino = 0;
};

// When the shim started, seconds since the epoch: a report says when it was written and how long
// after the start; a trace's header holds the start itself (run_from_trace puts it in wall_time_s).
double run_start_s(const RunView& v) {
  return v.source == "report" ? v.meta.wall_time_s - v.meta.duration_s : v.meta.wall_time_s;
}

// One process wrote both: the same pid, host and rank, started at the same moment (both files
// record the shim's start to the microsecond; a second apart is another process).
bool same_run(const RunView& a, const RunView& b) {
  return a.meta.pid != 0 && a.meta.pid == b.meta.pid && a.meta.host == b.meta.host && a.meta.rank == b.meta.rank &&
         std::fabs(run_start_s(a) - run_start_s(b)) < 1.0;
}

// Which file of one run gives its row: the exit report (the run's own figures), then the trace of
// a run that ended, then whichever covers more of the run.
bool better_source(const RunView& a, const RunView& b) {
  auto score = [](const RunView& v) { return (v.meta.reason == "exit" ? 2 : 0) + (v.source == "report" ? 1 : 0); };
  if (score(a) != score(b)) return score(a) > score(b);
  return a.meta.duration_s > b.meta.duration_s;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Every regular file in `dir` and in the directories below it, in order: a job's reports are often
// kept a directory per node or per rank. A directory reached twice (a link back up the tree) is
// read once, and the walk stops 16 levels down.
void list_tree(const std::string& dir, int depth, std::set<std::pair<dev_t, ino_t>>* seen,
               std::vector<std::string>* out) {
  struct stat st;
  if (depth > 16 || ::stat(dir.c_str(), &st) != 0 || !seen->insert({st.st_dev, st.st_ino}).second) return;
  std::vector<std::string> subdirs;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string p = dir + (dir.back() == '/' ? "" : "/") + name;
      if (::stat(p.c_str(), &st) != 0) continue;
      if (S_ISREG(st.st_mode)) out->push_back(p);
      else if (S_ISDIR(st.st_mode)) subdirs.push_back(p);
    }
    ::closedir(d);
  }
  for (const std::string& sub : subdirs) list_tree(sub, depth + 1, seen, out);
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  std::set<std::pair<dev_t, ino_t>> seen;
  list_tree(dir, 0, &seen, &out);
  std::sort(out.begin(), out.end());
  return out;
}

// Begins like a gpushim trace, or a JSON document that names the report schema.
bool looks_like_ours(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char head[4096];
  const ssize_t n = ::read(fd, head, sizeof(head));
  ::close(fd);
  if (n <= 0) return false;
  std::string s(head, static_cast<size_t>(n));
  // Compressed (ranks' files kept as .json.gz, .trace.gz): judged by what the head decompresses
  // to, or a damaged one was skipped like an unrelated file, and the merge exited 0 without it.
  if (looks_like_gzip(head, static_cast<size_t>(n))) {
    GzipInput gz;
    std::string plain, why;
    bool over = false;
    gz.feed(head, static_cast<size_t>(n), sizeof(head) * 16, &plain, &why, &over);
    s = std::move(plain);
  }
  return s.rfind("GPUSHIMT", 0) == 0 || s.find("gpushim-report/") != std::string::npos;
}

// Figures of a damaged report reach 2^64 - 1, which the reader accepts: sums saturate there, and
// a median back from double (2^64 - 1 rounds up to 2^64, undefined to cast) is clamped to it.
uint64_t saturated_sum(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
uint64_t bytes_of(double v) { return v >= 18446744073709551616.0 ? UINT64_MAX : v > 0 ? static_cast<uint64_t>(v) : 0; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string top_frame(const std::vector<FrameInfo>& frames) {
  return describe_site(frames, "(no stack)");
}

bool numeric(const std::string& s, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtol(s.c_str(), &end, 10);
  return *end == '\0';
}

// A reader's error names the file first ("F is neither ...", "F: not a gpushim report ..."); the
// skipped line names it already, so its reason goes without it.
std::string without_path(const std::string& err, const std::string& path) {
  if (err.compare(0, path.size(), path) != 0) return err;
  std::string rest = err.substr(path.size());
  if (rest.compare(0, 2, ": ") == 0) return rest.substr(2);
  if (rest.compare(0, 4, " is ") == 0) return rest.substr(4);
  return err;
}

int run_merge(const Cli& cli) {
  std::string err;
  const double threshold = cli.number("--threshold") / 100.0;

  std::vector<RowData> rows;
  std::vector<std::string> skipped;
  int damaged = 0;
  for (const std::string& arg : cli.operands) {
    const bool dir = is_dir(arg);
    const std::vector<std::string> files = dir ? list_dir(arg) : std::vector<std::string>{arg};
    for (const std::string& f : files) {
      RowData r;
      if (!load_run(f, &r.run, &err)) {
        if (!dir) {
          std::fprintf(stderr, "gpushim-analyze merge: %s\n", err.c_str());
          return 1;
        }
        // Other files may share the directory: listed with the reason. A report or trace that
        // does not read is damaged: said on stderr, and the merge exits 1 after its table, since
        // a rank is missing from it.
        if (looks_like_ours(f)) {
          std::fprintf(stderr, "gpushim-analyze merge: skipping a damaged report or trace: %s\n", err.c_str());
          ++damaged;
        }
        skipped.push_back(f + " (" + without_path(err, f) + ")");
        continue;
      }
      // The same file given twice (by another name, or in a directory also given) counts once.
      struct stat st;
      if (::stat(f.c_str(), &st) == 0) r.has_inode = true, r.dev = st.st_dev, r.ino = st.st_ino;
      auto twice = std::find_if(rows.begin(), rows.end(), [&](const RowData& x) {
        return r.has_inode && x.has_inode && x.dev == r.dev && x.ino == r.ino;
      });
      if (twice != rows.end()) {
        skipped.push_back(f + " (the same file as " + twice->run.path + ", counted once)");
        continue;
      }
      // A run's report and its trace (GPUSHIM_REPORT and GPUSHIM_TRACE both on) are one row.
      auto same = std::find_if(rows.begin(), rows.end(), [&](const RowData& x) { return same_run(x.run, r.run); });
      if (same != rows.end()) {
        if (better_source(r.run, same->run)) {
          r.also = std::move(same->also);
          r.also.push_back(same->run.path);
          *same = std::move(r);
        } else {
          same->also.push_back(r.run.path);
        }
        continue;
      }
      rows.push_back(std::move(r));
    }
  }
  if (rows.empty()) {
    // Only directories get here (a file given that does not read ends the merge above): named,
    // with what they held, since "no reports or traces found" left the user to guess where.
    std::string where;
    for (size_t i = 0; i < cli.operands.size(); ++i)
      where += (i == 0 ? "" : i + 1 == cli.operands.size() ? " or " : ", ") + printable(cli.operands[i]);
    const std::string held = !skipped.empty() ? plural(skipped.size(), "file") + " there, none a report or trace that reads"
                             : cli.operands.size() == 1 ? "it holds no files"
                                                        : "they hold no files";
    std::fprintf(stderr, "gpushim-analyze merge: no reports or traces found in %s (%s)\n", where.c_str(), held.c_str());
    return 1;
  }
  for (RowData& r : rows) {
    const ReportData& m = r.run.meta;
    r.label = !m.rank.empty() ? "rank " + m.rank : "pid " + std::to_string(m.pid);
    // One scope for all three figures: the highest device's peak beside every device's live
    // memory gave a two-device rank 'peak allocated 61.0 MiB, live at end 90.0 MiB'.
    uint64_t highest = 0;
    for (const DeviceReport& d : m.devices) {
      if (d.peak_bytes >= highest) highest = d.peak_bytes, r.peak_device = d.device;
      r.peak_allocated = saturated_sum(r.peak_allocated, d.peak_bytes);
      r.peak_reserved = saturated_sum(r.peak_reserved, d.peak_reserved_bytes);
      r.live = saturated_sum(r.live, d.live_bytes);
    }
    r.devices = m.devices.size();
    if (!r.run.growth.empty()) {
      r.suspect_kind = "growth";
      r.suspect = "grew " + human_bytes(r.run.growth[0].grew_bytes) + " at " + top_frame(r.run.growth[0].frames);
    } else if (!r.run.sites.empty() && r.run.sites[0].live_bytes) {
      r.suspect_kind = "live";
      r.suspect = human_bytes(r.run.sites[0].live_bytes) + " live at " + top_frame(r.run.sites[0].frames);
    }
  }
  // Runs that no rank, pid and host tell apart (traces converted from CPU recordings are all
  // pid 0 on cpu-recording; pids recur across a cluster's machines and restarts) are named by
  // their file too. Decided for every row before any label changes.
  std::vector<bool> ambiguous(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    ambiguous[i] = std::count_if(rows.begin(), rows.end(), [&](const RowData& x) {
                     return x.label == rows[i].label && x.run.meta.host == rows[i].run.meta.host;
                   }) > 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!ambiguous[i]) continue;
    const std::string& path = rows[i].run.path;
    const size_t slash = path.rfind('/');
    rows[i].label += " (" + (slash == std::string::npos ? path : path.substr(slash + 1)) + ")";
  }
  std::stable_sort(rows.begin(), rows.end(), [](const RowData& a, const RowData& b) {
    long ra, rb;
    const bool na = numeric(a.run.meta.rank, &ra), nb = numeric(b.run.meta.rank, &rb);
    if (na && nb && ra != rb) return ra < rb;
    if (na != nb) return na;
    return a.label < b.label;
  });

  struct Metric {
    const char* name;
    uint64_t RowData::*field;
    double median = 0, mad = 0;
  };
  Metric metrics[] = {{"peak allocated", &RowData::peak_allocated},
                      {"peak reserved", &RowData::peak_reserved},
                      {"live at end", &RowData::live}};
  for (Metric& mt : metrics) {
    std::vector<double> v;
    for (const RowData& r : rows) v.push_back(static_cast<double>(r.*mt.field));
    mt.median = median(v);
    std::vector<double> dev;
    for (double x : v) dev.push_back(std::fabs(x - mt.median));
    mt.mad = median(dev);
    if (rows.size() < 3) continue;
    for (RowData& r : rows) {
      const double x = static_cast<double>(r.*mt.field), d = std::fabs(x - mt.median);
      if (d > 3.5 * 1.4826 * mt.mad && d > threshold * mt.median && d >= 1048576.0) {
        char buf[160];
        if (mt.median > 0)
          std::snprintf(buf, sizeof(buf), "%s %s%.0f%% vs median", mt.name, x > mt.median ? "+" : "-", 100 * d / mt.median);
        else
          std::snprintf(buf, sizeof(buf), "%s %s vs median 0", mt.name, human_bytes(bytes_of(x)).c_str());
        r.outliers.push_back(buf);
      }
    }
  }

  if (cli.has("--json")) {
    std::string j = "{\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const RowData& r = rows[i];
      j += std::string(i ? "," : "") + "{\"path\":";
      append_json_string(&j, r.run.path);
      j += ",\"label\":";
      append_json_string(&j, r.label);
      j += ",\"rank\":";
      append_json_string(&j, r.run.meta.rank);
      j += ",\"pid\":" + std::to_string(r.run.meta.pid) + ",\"host\":";
      append_json_string(&j, r.run.meta.host);
      j += ",\"source\":";
      append_json_string(&j, r.run.source);
      j += ",\"also\":[";
      for (size_t k = 0; k < r.also.size(); ++k) {
        j += k ? "," : "";
        append_json_string(&j, r.also[k]);
      }
      j += "]";
      j += ",\"policy\":";
      append_json_string(&j, r.run.meta.policy);
      j += ",\"reason\":";
      append_json_string(&j, r.run.meta.reason);
      j += ",\"peak_allocated\":" + std::to_string(r.peak_allocated) + ",\"peak_device\":" + std::to_string(r.peak_device) +
           ",\"devices\":" + std::to_string(r.devices) +
           ",\"peak_reserved\":" + std::to_string(r.peak_reserved) + ",\"live\":" + std::to_string(r.live) +
           ",\"suspect_kind\":";
      append_json_string(&j, r.suspect_kind);
      j += ",\"suspect\":";
      append_json_string(&j, r.suspect);
      j += ",\"outlier\":" + std::string(r.outliers.empty() ? "false" : "true") + ",\"outliers\":[";
      for (size_t k = 0; k < r.outliers.size(); ++k) {
        j += k ? "," : "";
        append_json_string(&j, r.outliers[k]);
      }
      j += "],\"notes\":[";
      for (size_t k = 0; k < r.run.notes.size(); ++k) {
        j += k ? "," : "";
        append_json_string(&j, r.run.notes[k]);
      }
      j += "]}";
    }
    j += "],\"medians\":{";
    for (size_t k = 0; k < 3; ++k)
      j += std::string(k ? "," : "") + "\"" + metrics[k].name + "\":" + std::to_string(bytes_of(metrics[k].median));
    j += "},\"skipped\":[";
    for (size_t k = 0; k < skipped.size(); ++k) {
      j += k ? "," : "";
      append_json_string(&j, skipped[k]);
    }
    j += "]}\n";
    return print_output("merge", j) != 0 || damaged != 0 ? 1 : 0;
  }

  std::string o = "gpushim merge: " + std::to_string(rows.size()) + (rows.size() == 1 ? " run" : " runs") + "; median peak allocated " +
                  human_bytes(bytes_of(metrics[0].median)) + ", median live at end " +
                  human_bytes(bytes_of(metrics[2].median)) + "\n";
  // Columns as wide as their longest entry, within bounds: hosts cut to 12 characters made the
  // rows of pods named "trainer-worker-0" and "trainer-worker-1" (each its process pid 1) the same.
  size_t label_width = 14, host_width = 12;
  for (const RowData& r : rows) {
    label_width = std::max(label_width, std::min<size_t>(r.label.size(), 32));
    host_width = std::max(host_width, std::min<size_t>(r.run.meta.host.size(), 48));
  }
  const int lw = static_cast<int>(label_width), hw = static_cast<int>(host_width);
  char line[512];
  std::snprintf(line, sizeof(line), "%-*s %-*s %15s %15s %15s  %s\n", lw, "run", hw, "host", "peak allocated",
                "peak reserved", "live at end", "top suspect");
  o += line;
  // Reserved memory depends on the policy: a run under another policy than most is marked, so a
  // vmm rank flagged among caching ranks is not taken for a leak.
  std::map<std::string, size_t> policies;
  for (const RowData& r : rows) ++policies[r.run.meta.policy];
  const std::string usual =
      std::max_element(policies.begin(), policies.end(), [](const auto& x, const auto& y) { return x.second < y.second; })
          ->first;
  size_t flagged = 0;
  for (const RowData& r : rows) {
    const std::string other_policy = r.run.meta.policy != usual ? " [policy " + r.run.meta.policy + "]" : "";
    const std::string several = r.devices > 1 ? " [" + std::to_string(r.devices) + " devices]" : "";
    // The fixed columns only: a suspect's frame (a C++ template, a long path) has no bound, and
    // cut by the buffer it took the row's marks and its newline with it.
    std::snprintf(line, sizeof(line), "%-*s %-*s %15s %15s %15s  ", lw, printable(r.label.substr(0, label_width)).c_str(),
                  hw, printable(r.run.meta.host.substr(0, host_width)).c_str(), human_bytes(r.peak_allocated).c_str(),
                  human_bytes(r.peak_reserved).c_str(), human_bytes(r.live).c_str());
    o += line;
    o += r.suspect.empty() ? "-" : r.suspect;
    o += r.run.meta.reason == "snapshot" ? " [snapshot]" : r.run.meta.reason == "truncated" ? " [cut short]" : "";
    o += several + other_policy + "\n";
    if (!r.outliers.empty()) {
      ++flagged;
      std::string l = "    ^ outlier:";
      for (const std::string& x : r.outliers) l += " " + x + ";";
      l.pop_back();
      o += l + "\n";
    }
  }
  o += flagged ? std::to_string(flagged) + " outlier run(s)\n" : "no outliers\n";
  for (const RowData& r : rows)
    for (const std::string& a : r.also)
      o += "same run: " + a + " (its row is from " + r.run.path + ")\n";
  // What the readers noticed about a row's input (a trace cut short, events dropped) bounds what
  // its figures mean; a note shared by many rows (a module missing here) is said once.
  std::vector<std::pair<std::string, std::vector<std::string>>> notes;
  for (const RowData& r : rows) {
    // A label several rows share (pid 1 in every container) is told apart by its host.
    const bool shared = std::count_if(rows.begin(), rows.end(), [&](const RowData& x) { return x.label == r.label; }) > 1;
    const std::string who = shared ? r.label + " on " + r.run.meta.host : r.label;
    for (const std::string& n : r.run.notes) {
      auto it = std::find_if(notes.begin(), notes.end(), [&](const auto& x) { return x.first == n; });
      if (it == notes.end()) notes.push_back({n, {who}});
      else it->second.push_back(who);
    }
  }
  for (const auto& [n, labels] : notes) {
    std::string who;
    for (size_t k = 0; k < labels.size() && k < 8; ++k) who += (k ? ", " : "") + labels[k];
    if (labels.size() > 8) who += " and " + std::to_string(labels.size() - 8) + " more";
    o += "note (" + who + "): " + n + "\n";
  }
  for (const std::string& s : skipped) o += "skipped: " + s + "\n";
  return print_output("merge", o) != 0 || damaged != 0 ? 1 : 0;
}

}  // namespace

const CommandSpec kMergeCommand{
    .name = "merge",
    .operands = "DIR|FILE...",
    .min_operands = 1,
    .max_operands = SIZE_MAX,
    .summary = "one table across ranks or processes, outliers flagged",
    .description = R"(One table across the ranks or processes of a job: for each report, snapshot or trace (a directory
stands for every report and trace in it and in the directories below it), one row with the rank
(or pid), peak allocated, peak reserved, live at the end, and the top suspect (the strongest growth
suspect when the input knows growth, else the largest live site). A run on several devices has
the sum of its devices' figures (each device's own peak), marked "[N devices]"; one under another
policy than most rows, whose reserved memory is not comparable, is marked "[policy P]".

One run is one row: a report and the trace of the same process (the same pid, host and rank,
started at the same moment), or a snapshot and its exit report, give one row, from the exit report
when there is one (the others are named on a "same run:" line, and in "also" with --json); the
same file given twice counts once.

A value is flagged as an outlier when it is far from the median of all rows: more than 3.5 robust
standard deviations (1.4826 x the median absolute deviation) and more than PCT percent and at
least 1 MiB away. With fewer than 3 rows nothing is flagged.
)",
    .options =
        {
            {.name = "--threshold",
             .kind = ValueKind::kNumber,
             .value_name = "PCT",
             .help = "relative distance from the median below which nothing is flagged",
             .fallback = "10",
             .min = 0,
             .max = 1e6},
            {.name = "--json", .help = "machine-readable output"},
        },
    .run = run_merge,
};

}  // namespace gpushim::analysis
