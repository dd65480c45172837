#include "run_view.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "cli.h"
#include "gzip_input.h"
#include "accounting/period_detector.h"
#include "accounting/site_history.h"
#include "memory_levels.h"
#include "offline_symbolizer.h"
#include "report/growth_verdict.h"
#include "stacks/site_identity.h"
#include "trace/trace_format.h"
#include "util/iteration_counter.h"
#include "util/json_string.h"
#include "util/units.h"

namespace gpushim::analysis {
namespace {

constexpr size_t kTimelinePointsPerDevice = 4000;

uint8_t memory_kind(const TraceEvent& e) { return e.flags & trace::kFlagKindMask; }
const char* kind_name(uint8_t k) { return memory_kind_name(static_cast<MemoryKind>(k)); }


struct SiteState {
  uint64_t live = 0, count = 0, peak = 0, allocs = 0;
  uint64_t at_peak = 0;
};

struct DeviceState {
  uint64_t allocated = 0, count = 0, reserved = 0, requested = 0;
  uint64_t peak_allocated = 0, peak_reserved = 0;
  uint64_t peak_event = 0;  // index of the event that set peak_allocated
  double peak_t = 0;
  uint64_t allocs = 0, frees = 0, ooms = 0, segment_allocs = 0, segment_frees = 0;
};

// Keeps at most ~max points of a step series: per time bucket the first point and the one with the
// highest allocated, so peaks survive thinning.
std::vector<TimelineSample> thin(const std::vector<TimelineSample>& pts, size_t max) {
  if (pts.size() <= max) return pts;
  // Below 4 (two buckets of first and highest) no thinning keeps the peak: 4 it is, not all
  // points, which --max-points 1 to 3 gave (625 points for 2 asked).
  max = std::max<size_t>(max, 4);
  if (pts.size() <= max) return pts;
  std::vector<TimelineSample> out;
  const double t0 = pts.front().t_s, t1 = pts.back().t_s;
  const size_t buckets = max / 2;
  const double width = (t1 - t0) / static_cast<double>(buckets);
  size_t i = 0;
  while (i < pts.size()) {
    const double end = width > 0 ? t0 + width * (std::floor((pts[i].t_s - t0) / width) + 1) : t1 + 1;
    const size_t first = i;
    size_t best = i;
    while (i < pts.size() && pts[i].t_s < end) {
      if (pts[i].allocated > pts[best].allocated) best = i;
      ++i;
    }
    if (i == first) ++i;
    out.push_back(pts[first]);
    if (best != first) out.push_back(pts[best]);
  }
  if (out.back().t_s != pts.back().t_s || out.back().allocated != pts.back().allocated) out.push_back(pts.back());
  return out;
}

}  // namespace

const DeviceReport* RunView::device(int ordinal) const {
  for (const DeviceReport& d : meta.devices)
    if (d.device == ordinal) return &d;
  return nullptr;
}

uint64_t input_limit_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  // An eighth: a JSON input's parsed form peaks at about four times its size (a 1 GB report, 4.1 GB
  // resident), so an input just under a quarter could take all of memory.
  const uint64_t fallback = std::max<uint64_t>(memory / 8, 64ull << 20);
  if (const char* env = std::getenv("GPUSHIM_ANALYZE_MAX_INPUT")) {
    uint64_t v = 0;
    if (parse_size(env, &v) && v != 0) return v;
    // A value that does not parse is not silently dropped: one line (per process), then the default.
    static bool warned = false;
    if (!warned) {
      warned = true;
      std::fprintf(stderr,
                   "gpushim-analyze: warning: GPUSHIM_ANALYZE_MAX_INPUT='%s' is not a size above 0 (expected bytes "
                   "with units, e.g. 512MiB or 4GiB): using the default, %s\n",
                   env, human_bytes(fallback).c_str());
    }
  }
  return fallback;
}

uint64_t trace_event_limit() { return std::max<uint64_t>(input_limit_bytes() / sizeof(trace::TraceEvent), 1); }

bool parse_trace_to_read(const std::string& bytes, TraceData* out, std::string* error) {
  if (!parse_trace(bytes, out, error, trace_event_limit())) return false;
  *error = out->nothing_to_read();
  return error->empty();
}

bool looks_like_report_or_trace(const char* head, size_t n) {
  if (n >= sizeof(trace::kFileMagic) && std::memcmp(head, trace::kFileMagic, sizeof(trace::kFileMagic)) == 0) return true;
  // A report is a JSON object whose first member is a key (its schema): optional whitespace (and a
  // UTF-8 byte-order mark), '{', whitespace, then '"' or '}'. JSON allows no control byte but
  // whitespace anywhere, in strings or out, so none may occur in the head either. Checking only the
  // first byte let random input through one time in about 250 (`/dev/urandom` starting with '{'
  // was then read to the size limit); with the whole first block checked, practically never.
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  for (size_t k = 0; k < n; ++k)
    if (static_cast<unsigned char>(head[k]) < 0x20 && !blank(head[k])) return false;
  size_t i = n >= 3 && std::memcmp(head, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
  while (i < n && blank(head[i])) ++i;
  if (i == n) return true;  // all blank so far: the parser will say what is wrong
  if (head[i] != '{') return false;
  ++i;
  while (i < n && blank(head[i])) ++i;
  return i == n || head[i] == '"' || head[i] == '}';
}

bool read_file(const std::string& path, std::string* out, std::string* error, std::string* torn) {
  // "-": standard input, as other command-line tools read it (a duplicate, closed below as a file's).
  const int fd = path == "-" ? ::fcntl(0, F_DUPFD_CLOEXEC, 0) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  // O_NONBLOCK only so that opening a FIFO without a writer cannot hang; reads block as usual.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const uint64_t limit = input_limit_bytes();
  auto fail = [&](const std::string& why) {
    *error = why;
    ::close(fd);
    return false;
  };
  auto too_large = [&] {
    return fail(path + " is larger than " + human_bytes(limit) +
                ", the most gpushim-analyze reads (GPUSHIM_ANALYZE_MAX_INPUT raises it)");
  };
  struct stat st;
  out->clear();
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    if (static_cast<uint64_t>(st.st_size) > limit) return too_large();
    out->reserve(static_cast<size_t>(st.st_size));  // one allocation, not a doubling series
  }
  // The first bytes decide: gzip is decompressed as it is read, and the checks below (the early
  // refusal, the size limit) apply to what it decompresses to.
  std::string head;
  enum class Form { kUnknown, kPlain, kGzip } form = Form::kUnknown;
  GzipInput gzip;
  auto take = [&](const char* p, size_t n) {
    const bool unchecked = out->size() < 16;
    if (form == Form::kGzip) {
      bool over = false;
      std::string why;
      if (!gzip.feed(p, n, limit, out, &why, &over)) return over ? too_large() : fail(path + ": " + why);
    } else {
      if (out->size() + n > limit) return too_large();
      out->append(p, n);
    }
    // Checked once, on everything the first reads gave (a block of up to 64 KiB from a file).
    if (unchecked && out->size() >= 16 && !looks_like_report_or_trace(out->data(), out->size()))
      return fail(path + " is neither a gpushim report (JSON) nor a gpushim trace" +
                  (form == Form::kGzip ? " (decompressed)" : ""));
    return true;
  };
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot read " + path + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    if (form == Form::kUnknown) {
      head.append(buf, static_cast<size_t>(n));
      if (head.size() < 3) continue;
      form = looks_like_gzip(head.data(), head.size()) ? Form::kGzip : Form::kPlain;
      if (!take(head.data(), head.size())) return false;
      continue;
    }
    if (!take(buf, static_cast<size_t>(n))) return false;
  }
  if (form == Form::kUnknown) {
    form = Form::kPlain;
    if (!take(head.data(), head.size())) return false;
  }
  if (form == Form::kGzip && !gzip.complete()) {
    if (torn == nullptr || out->empty()) return fail(path + ": gzip data cut short");
    *torn = path + ": the gzip data is cut short: read up to the tear (" + human_bytes(out->size()) + " decompressed)";
  }
  // Said as it is: the JSON parser's "unexpected end of input at line 1, column 1" was the message.
  if (out->empty()) return fail(path + " is empty: no report or trace was written into it");
  // Shorter than the check above waits for ("training log": "invalid JSON ... invalid literal").
  if (out->size() < 16 && !looks_like_report_or_trace(out->data(), out->size()))
    return fail(path + " is neither a gpushim report (JSON) nor a gpushim trace" +
                (form == Form::kGzip ? " (decompressed)" : ""));
  ::close(fd);
  return true;
}

std::string human_bytes(uint64_t b) { return format_bytes(b); }


std::string site_identity(const SiteView& s) { return gpushim::site_identity(s.device, s.kind, s.frames); }

bool run_from_report(const ReportFile& file, const std::string& path, RunView* out) {
  RunView v;
  v.path = path;
  v.source = "report";
  v.meta = file.report;
  for (const SiteReport& s : file.report.sites) {
    SiteView sv;
    sv.device = s.device;
    sv.kind = s.kind;
    sv.live_bytes = s.live_bytes;
    sv.live_count = s.live_count;
    sv.frames = s.frames;
    v.sites.push_back(std::move(sv));
  }
  // The shim writes sites largest first, but a report edited, merged by another tool or cut down
  // by hand need not be; every command relies on the order.
  std::stable_sort(v.sites.begin(), v.sites.end(),
                   [](const SiteView& a, const SiteView& b) { return a.live_bytes > b.live_bytes; });
  v.meta.sites.clear();
  v.growth_known = file.has_growth;
  if (file.growth_verdict == "not judged") v.growth_not_judged = file.growth_evidence;
  v.growth_verdict = file.growth_verdict;
  v.growth_evidence = file.growth_evidence;
  v.growth_unit = growth_unit(file.growth_steps_per_pattern);
  v.iteration_marks = file.iteration_marks;
  for (const GrowthEntry& g : file.growth) {
    GrowthSuspect gs;
    gs.device = g.device;
    gs.frames = g.frames;
    auto fig = [&](const char* k) {
      auto it = g.figures.find(k);
      return it == g.figures.end() ? 0.0 : it->second;
    };
    // The growth section is read leniently (report_reader.cpp): a damaged figure, negative or
    // past 2^64 (or a rate past any real one), is clamped, as the casts are undefined out of range.
    auto bounded = [](double d, double most) { return d > 0 ? std::min(d, most) : 0.0; };
    gs.bytes_per_s = bounded(fig("bytes_per_s"), 1e19);
    gs.bytes_per_iteration = bounded(fig("bytes_per_iteration"), 1e19);
    auto whole = [&](const char* k) {
      const double d = fig(k);
      return d >= 18446744073709551616.0 ? UINT64_MAX : static_cast<uint64_t>(bounded(d, d));
    };
    gs.live_bytes = whole("live_bytes");
    gs.live_count = whole("live_count");
    gs.grew_bytes = whole("growth_bytes");  // the report's name for it
    gs.checkpoints = static_cast<int>(bounded(fig("samples"), INT32_MAX));
    v.growth.push_back(std::move(gs));
  }
  if (file.report.reason == "snapshot")
    v.notes.push_back("a snapshot taken while the process ran, " + std::to_string(file.report.duration_s) +
                      " s after the shim started: live means live at that moment");
  *out = std::move(v);
  return true;
}

void run_from_trace(const TraceData& t, const std::string& path, RunView* out) {
  RunView v;
  v.path = path;
  v.source = "trace";
  ReportData& m = v.meta;
  m.pid = t.header.pid;
  m.exe = t.header.exe;
  m.host = t.header.host;
  m.rank = t.header.rank;
  m.policy = t.header.policy;
  m.reason = t.end ? "exit" : "truncated";
  m.stack_depth = static_cast<int>(t.header.stack_depth);
  m.wall_time_s = static_cast<double>(t.header.start_wall_ns) / 1e9;
  const uint64_t last_t = t.end ? t.end->end_mono_ns : (t.events.empty() ? t.header.start_mono_ns : t.events.back().t_ns);
  m.duration_s = t.seconds(last_t);
  if (t.truncated) v.notes.push_back(t.stop_note() + ": figures cover what was recorded");
  else if (!t.end) v.notes.push_back("the trace has no end record (the process did not exit cleanly)");
  if (t.dropped)
    v.notes.push_back(std::to_string(t.dropped) +
                      " events were dropped while recording (the trace's writer fell behind the program's allocations): "
                      "the device totals are the shim's own (the end record), where it has one; sites and the timeline are "
                      "approximate");
  if (t.implied_frees)
    v.notes.push_back(std::to_string(t.implied_frees) +
                      " allocations whose free the trace lacks end where their address was handed out again");
  if (t.unmatched_frees) v.notes.push_back(std::to_string(t.unmatched_frees) + " frees of allocations the trace does not contain were ignored");

  for (const TraceEvent& e : t.events)
    if (e.kind == EventKind::kIteration) v.iterations_s.push_back(t.seconds(e.t_ns));
  v.iteration_marks = v.iterations_s.size();
  // Growth replays the shim's own checkpoints (kCheckpoint events) over the same SiteHistory and
  // the same verdict (report/growth_verdict.h), so the trace says what the exit report said.
  SiteHistory history;
  auto periods = std::make_unique<PeriodDetector>();
  absl::flat_hash_map<SiteKey, SiteTotals> live_sites;
  GrowthEvidence evidence;
  size_t next_checkpoint = 0;
  auto take_checkpoint = [&](const TraceData::Checkpoint& c) {
    history.sample(c.t_ns - std::min(c.t_ns, t.header.start_mono_ns), c.iterations,
                   std::vector<std::pair<SiteKey, SiteTotals>>(live_sites.begin(), live_sites.end()),
                   periods->allocations(), iteration_point_of_checkpoint(c.sources));
    evidence.iterations = c.iterations;
    evidence.iteration_sources = c.sources & IterationCounter::kSources;
  };

  std::map<int, DeviceState> devs;
  for (const auto& d : t.devices) devs[d.ordinal];
  MemoryLevels levels;
  absl::flat_hash_map<SiteKey, SiteState> sites;
  std::map<uint8_t, OtherMemoryReport> other;
  // A Python program's report counts live memory when the interpreter's teardown began (format
  // 1.5 says when in the end record): the trace's live figures are taken at the same moment, so
  // that report and trace of one run agree, and what the teardown freed is said apart.
  const uint64_t teardown_at = t.end ? t.end->teardown_mono_ns : 0;
  std::optional<std::map<int, DeviceState>> devs_at_teardown;
  absl::flat_hash_map<SiteKey, SiteState> sites_at_teardown;
  auto take_teardown = [&] {
    devs_at_teardown = devs;
    sites_at_teardown = sites;
  };
  for (uint64_t i = 0; i < t.events.size(); ++i) {
    const TraceEvent& e = t.events[i];
    if (teardown_at != 0 && !devs_at_teardown && e.t_ns > teardown_at) take_teardown();
    while (next_checkpoint < t.checkpoints.size() && t.checkpoints[next_checkpoint].events_before <= i)
      take_checkpoint(t.checkpoints[next_checkpoint++]);
    if (e.kind == EventKind::kAlloc || e.kind == EventKind::kOom) periods->on_allocation(e.stack);
    if (e.kind == EventKind::kAlloc || e.kind == EventKind::kFree) {
      const SiteKey k = site_key(e);
      SiteTotals& st = live_sites[k];
      if (e.kind == EventKind::kAlloc) st.bytes += e.size, ++st.count;
      else st.bytes -= std::min(st.bytes, e.size), st.count -= st.count ? 1 : 0;
      if (st.count == 0) live_sites.erase(k);
    }
    const double ts = t.seconds(e.t_ns);
    const uint8_t kind = memory_kind(e);
    const MemoryLevels::Device* level = levels.apply(e);
    switch (e.kind) {
      case EventKind::kAlloc:
      case EventKind::kFree: {
        const bool alloc = e.kind == EventKind::kAlloc;
        SiteState& s = sites[site_key(e)];
        if (alloc) {
          s.live += e.size, ++s.count, ++s.allocs;
          s.peak = std::max(s.peak, s.live);
        } else {
          s.live -= std::min(s.live, e.size), s.count -= s.count ? 1 : 0;
        }
        if (kind != static_cast<uint8_t>(MemoryKind::kDevice)) {
          OtherMemoryReport& o = other[kind];
          o.kind = kind_name(kind);
          if (alloc) o.live_bytes += e.size, ++o.live_count, ++o.total_allocs, o.peak_bytes = std::max(o.peak_bytes, o.live_bytes);
          else o.live_bytes -= std::min(o.live_bytes, e.size), o.live_count -= o.live_count ? 1 : 0, ++o.total_frees;
          break;
        }
        DeviceState& d = devs[e.device];
        ++(alloc ? d.allocs : d.frees);
        // What the program asked for (a pitched allocation asked for all of its pitch x height).
        if (alloc) d.requested += e.requested;
        else d.requested -= std::min(d.requested, e.requested);
        break;
      }
      case EventKind::kSegmentAlloc:
      case EventKind::kSegmentMap: ++devs[e.device].segment_allocs; break;
      case EventKind::kSegmentFree:
      case EventKind::kSegmentUnmap: ++devs[e.device].segment_frees; break;
      case EventKind::kOom: {
        DeviceState& d = devs[e.device];
        ++d.ooms;
        OomReport o;
        o.t_s = ts;
        o.device = e.device;
        o.requested = e.requested;
        o.device_free = e.size;
        o.allocated = d.allocated;
        o.reserved = d.reserved;
        o.cached_free = o.reserved - std::min(o.reserved, o.allocated);
        if (const trace::DeviceInfo* info = t.device(e.device)) o.capacity = info->capacity, o.limit = info->limit;
        m.ooms.push_back(std::move(o));
        break;
      }
      default: break;
    }
    if (level == nullptr) continue;
    DeviceState& d = devs[e.device];
    d.allocated = level->allocated;
    d.count = level->count;
    d.reserved = level->reserved();
    if (d.allocated > d.peak_allocated) d.peak_allocated = d.allocated, d.peak_event = i, d.peak_t = ts;
    d.peak_reserved = std::max(d.peak_reserved, d.reserved);
  }

  while (next_checkpoint < t.checkpoints.size()) take_checkpoint(t.checkpoints[next_checkpoint++]);
  if (teardown_at != 0 && !devs_at_teardown) take_teardown();
  if (devs_at_teardown) {
    m.teardown.observed = true;
    m.teardown.began_s = t.seconds(teardown_at);
    for (auto& [k, s] : sites) {
      const auto then = sites_at_teardown.find(k);
      const uint64_t live = then == sites_at_teardown.end() ? 0 : then->second.live;
      const uint64_t count = then == sites_at_teardown.end() ? 0 : then->second.count;
      if (live > s.live || count > s.count) {
        m.teardown.freed_bytes += live > s.live ? live - s.live : 0;
        m.teardown.freed_count += count > s.count ? count - s.count : 0;
      }
      s.live = live;
      s.count = count;
    }
    for (auto& [ord, d] : devs) {
      // A device first used after the teardown began held nothing when it began.
      const auto then = devs_at_teardown->find(ord);
      const DeviceState none;
      const DeviceState& at = then == devs_at_teardown->end() ? none : then->second;
      d.allocated = at.allocated;
      d.count = at.count;
      d.reserved = at.reserved;
      d.requested = at.requested;
    }
  }

  // Second pass: what each site held when its device was at its peak.
  {
    absl::flat_hash_map<SiteKey, uint64_t> live;
    std::map<int, uint64_t> remaining;  // devices whose peak is still ahead
    for (auto& [ord, d] : devs)
      if (d.peak_allocated) remaining[ord] = d.peak_event;
    for (uint64_t i = 0; i < t.events.size() && !remaining.empty(); ++i) {
      const TraceEvent& e = t.events[i];
      if (e.kind == EventKind::kAlloc) live[site_key(e)] += e.size;
      else if (e.kind == EventKind::kFree) {
        uint64_t& l = live[site_key(e)];
        l -= std::min(l, e.size);
      }
      for (auto it = remaining.begin(); it != remaining.end();) {
        if (it->second != i) {
          ++it;
          continue;
        }
        for (const auto& [k, bytes] : live)
          if (k.device == it->first && k.kind == MemoryKind::kDevice) sites[k].at_peak = bytes;
        it = remaining.erase(it);
      }
    }
  }

  OfflineSymbolizer sym(t);
  for (auto& [ord, d] : devs) {
    DeviceReport r;
    r.device = ord;
    r.live_bytes = d.allocated;
    r.live_count = d.count;
    r.peak_bytes = d.peak_allocated;
    r.peak_allocated_at_s = d.peak_t;
    r.peak_reserved_bytes = d.peak_reserved;
    r.total_allocs = d.allocs;
    r.total_frees = d.frees;
    r.failed_allocs = d.ooms;
    if (const trace::DeviceInfo* info = t.device(ord)) r.capacity_bytes = info->capacity, r.limit_bytes = info->limit;
    r.pool.reserved_bytes = d.reserved;
    r.pool.requested_bytes = d.requested;
    r.pool.peak_reserved_bytes = d.peak_reserved;
    r.pool.cached_free_bytes = d.reserved - std::min(d.reserved, d.allocated);
    r.pool.segment_allocs = d.segment_allocs;
    r.pool.segment_frees = d.segment_frees;
    r.pool.ooms = d.ooms;
    const trace::DeviceTotals* shim = nullptr;  // the device's figures in the end record
    if (t.end)
      for (const trace::DeviceTotals& e : t.end->devices)
        if (e.ordinal == ord) shim = &e;
    const char* const held_past =
        " (the rest: memory held past the allocations, e.g. CUDA's own pool under cudaMallocAsync)";
    // The two figures as the note shows them: in bytes when rounding would show the same number
    // ("2.6 GiB is the shim's own figure; its events account for 2.6 GiB").
    auto apart = [](uint64_t shim_figure, uint64_t events_figure) {
      std::pair<std::string, std::string> f{human_bytes(shim_figure), human_bytes(events_figure)};
      if (f.first == f.second) {
        f.first += " (" + std::to_string(shim_figure) + " B)";
        f.second += " (" + std::to_string(events_figure) + " B)";
      }
      return f;
    };
    // The shim's own peak reserved, from the end record, is the run's figure: it also counts what
    // the events cannot show, such as the reservation CUDA's own stream-ordered pools hold beyond
    // their allocations (cudaMallocAsync under passthrough), so the exit report says the same.
    if (shim && shim->peak_reserved != d.peak_reserved) {
      const auto [shim_figure, events_figure] = apart(shim->peak_reserved, d.peak_reserved);
      v.notes.push_back("device " + std::to_string(ord) + ": peak reserved " + shim_figure +
                        " is the shim's own figure (the trace's end record); its events account for " +
                        events_figure + (shim->peak_reserved > d.peak_reserved ? held_past : ""));
      r.peak_reserved_bytes = r.pool.peak_reserved_bytes = shim->peak_reserved;
    }
    // Reserved at the end likewise, where the shim wrote it (trace format 1.4; older traces keep
    // the events' figure), unless the figures are of the teardown's start: the end record's is
    // of the exit.
    if (shim && shim->reserved && *shim->reserved != d.reserved && !m.teardown.observed) {
      const uint64_t reserved = *shim->reserved;
      const auto [shim_figure, events_figure] = apart(reserved, d.reserved);
      v.notes.push_back("device " + std::to_string(ord) + ": reserved at the end " + shim_figure +
                        " is the shim's own figure (the trace's end record); its events account for " +
                        events_figure + (reserved > d.reserved ? held_past : ""));
      r.pool.reserved_bytes = reserved;
      r.pool.cached_free_bytes = reserved - std::min(reserved, d.allocated);
    }
    // Events were dropped: the allocations and frees the events lack bend every figure counted
    // from them (a churning program that held nothing at exit once read as a 1.1 GiB leak), and
    // the end record holds the shim's own. Its live figures are of the exit, so they are taken
    // only where the events' are too (no interpreter teardown).
    if (shim && t.dropped) {
      const MemoryFigures events_figures = r.figures();
      MemoryFigures exact = shim->figures();
      if (m.teardown.observed) exact.live_bytes = r.live_bytes, exact.live_count = r.live_count;
      // A damaged or forged end record may not add up (the trace reader's fuzzer made one with
      // more allocations live than made): its figures are then not taken.
      const bool adds_up = exact.live_count <= exact.total_allocs && exact.total_frees <= exact.total_allocs &&
                           exact.live_bytes <= exact.peak_bytes;
      if (!adds_up) {
        v.notes.push_back("device " + std::to_string(ord) + ": the trace's end record does not add up (" +
                          std::to_string(exact.live_count) + " allocations live of " +
                          std::to_string(exact.total_allocs) + " made, " + std::to_string(exact.total_frees) +
                          " freed; live " + human_bytes(exact.live_bytes) + ", peak " + human_bytes(exact.peak_bytes) +
                          "): the figures are the events', which lack the dropped ones");
      } else if (exact.live_bytes != events_figures.live_bytes || exact.peak_bytes != events_figures.peak_bytes ||
                 exact.total_allocs != events_figures.total_allocs || exact.total_frees != events_figures.total_frees) {
        v.notes.push_back("device " + std::to_string(ord) + ": live " + human_bytes(exact.live_bytes) + ", peak allocated " +
                          human_bytes(exact.peak_bytes) + ", " + std::to_string(exact.total_allocs) + " allocations and " +
                          std::to_string(exact.total_frees) + " frees are the shim's own figures (the trace's end "
                          "record); the events that reached the trace account for live " +
                          human_bytes(events_figures.live_bytes) + ", peak " + human_bytes(events_figures.peak_bytes));
        r.set_figures(exact);
        r.pool.cached_free_bytes = r.pool.reserved_bytes - std::min(r.pool.reserved_bytes, exact.live_bytes);
      }
    }
    m.devices.push_back(r);
  }
  m.timeline = trace_timeline(t, kTimelinePointsPerDevice);
  for (auto& [k, o] : other) m.other_memory.push_back(o);

  // OOM stacks, in the order they happened.
  {
    size_t n = 0;
    for (const TraceEvent& e : t.events)
      if (e.kind == EventKind::kOom && n < m.ooms.size()) m.ooms[n++].frames = sym.stack(e.stack);
  }

  // Sites: symbolize, and merge those that symbolize the same (as the shim's report does).
  std::map<std::string, size_t> by_identity;
  for (const auto& [k, s] : sites) {
    SiteView sv;
    sv.device = k.device;
    sv.kind = memory_kind_name(k.kind);
    sv.live_bytes = s.live;
    sv.live_count = s.count;
    sv.has_history = true;
    sv.peak_bytes = s.peak;
    sv.at_device_peak_bytes = s.at_peak;
    sv.total_allocs = s.allocs;
    sv.frames = sym.stack(k.stack);
    const std::string id = site_identity(sv);
    auto [it, fresh] = by_identity.emplace(id, v.sites.size());
    if (fresh) {
      v.sites.push_back(std::move(sv));
      continue;
    }
    SiteView& into = v.sites[it->second];
    into.live_bytes += sv.live_bytes;
    into.live_count += sv.live_count;
    into.peak_bytes += sv.peak_bytes;  // an upper bound once merged
    into.at_device_peak_bytes += sv.at_device_peak_bytes;
    into.total_allocs += sv.total_allocs;
  }
  std::sort(v.sites.begin(), v.sites.end(), [](const SiteView& a, const SiteView& b) {
    if (a.live_bytes != b.live_bytes) return a.live_bytes > b.live_bytes;
    if (a.at_device_peak_bytes != b.at_device_peak_bytes) return a.at_device_peak_bytes > b.at_device_peak_bytes;
    return a.peak_bytes > b.peak_bytes;
  });

  // Growth: the one definition, over the checkpoints the shim took.
  const bool any_checkpoint = !t.checkpoints.empty();
  v.growth_known = any_checkpoint;
  if (!any_checkpoint) {
    // Checkpoints came with format 1.1: a later trace without any and without an end record was
    // cut short before its first, not written by an older shim.
    const std::string why = t.version_minor < 1 ? "written by an older shim, trace format 1." + std::to_string(t.version_minor)
                            : !t.end ? "the trace has no end record: it was cut short before the shim wrote one"
                                     : "the shim took none in this run";
    v.notes.push_back("the trace records no growth checkpoints (" + why + "): growth is unknown");
  }
  if (any_checkpoint) {
    evidence.samples = history.samples();
    if (evidence.iterations == 0 && t.header.stack_depth > 0) evidence.detected = periods->detect();
    const GrowthReport g = judge_growth(history.series(), evidence, [&](const SiteKey& k) { return sym.stack(k.stack); });
    v.growth_verdict = g.verdict;
    v.growth_evidence = g.evidence;
    v.growth_unit = growth_unit(g.steps_per_pattern);
    if (g.verdict == "not judged") v.growth_not_judged = g.evidence;
    for (const GrowthSuspectReport& r : g.suspects) {
      GrowthSuspect gs;
      gs.device = r.device;
      gs.frames = r.frames;
      gs.grew_bytes = r.growth_bytes;
      gs.bytes_per_s = r.bytes_per_s;
      gs.bytes_per_iteration = std::isnan(r.bytes_per_iteration) ? 0 : r.bytes_per_iteration;
      gs.live_bytes = r.live_bytes;
      gs.live_count = r.live_count;
      gs.checkpoints = static_cast<int>(r.samples);
      v.growth.push_back(std::move(gs));
    }
  }
  for (const std::string& n : sym.notes()) v.notes.push_back(n);
  *out = std::move(v);
}

std::vector<TimelineSample> trace_timeline(const TraceData& t, size_t max_points_per_device) {
  MemoryLevels levels;
  std::map<int, std::vector<TimelineSample>> points;
  for (const TraceEvent& e : t.events)
    if (const MemoryLevels::Device* d = levels.apply(e))
      points[e.device].push_back(TimelineSample{t.seconds(e.t_ns), e.device, d->allocated, d->reserved()});
  std::vector<TimelineSample> out;
  for (const auto& [dev, pts] : points)
    for (const TimelineSample& p : max_points_per_device ? thin(pts, max_points_per_device) : pts) out.push_back(p);
  std::stable_sort(out.begin(), out.end(), [](const TimelineSample& a, const TimelineSample& b) { return a.t_s < b.t_s; });
  return out;
}

bool load_run(const std::string& path, RunView* out, std::string* error, std::optional<TraceData>* trace) {
  std::string bytes, torn;
  if (!read_file(path, &bytes, error, &torn)) return false;
  if (looks_like_trace(bytes)) {
    TraceData t;
    if (!parse_trace_to_read(bytes, &t, error)) {
      *error = path + ": " + *error;
      return false;
    }
    run_from_trace(t, path, out);
    if (!torn.empty()) out->notes.insert(out->notes.begin(), torn);
    if (trace) trace->emplace(std::move(t));
    return true;
  }
  // A report cannot be read up to a tear: its JSON is one document.
  if (!torn.empty()) {
    *error = path + ": gzip data cut short";
    return false;
  }
  ReportFile r;
  if (!parse_report(bytes, &r, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return run_from_report(r, path, out);
}

void append_run_header_json(std::string* j, const RunView& run) {
  const ReportData& m = run.meta;
  *j += "{\"source\":";
  append_json_string(j, run.source);
  *j += ",\"path\":";
  append_json_string(j, run.path);
  *j += ",\"pid\":" + std::to_string(m.pid) + ",\"exe\":";
  append_json_string(j, m.exe);
  *j += ",\"rank\":";
  append_json_string(j, m.rank);
  *j += ",\"policy\":";
  append_json_string(j, m.policy);
  *j += ",\"reason\":";
  append_json_string(j, m.reason);
  char duration[40];
  std::snprintf(duration, sizeof(duration), "%.17g", m.duration_s);
  *j += std::string(",\"duration_s\":") + duration;
}

}  // namespace gpushim::analysis
