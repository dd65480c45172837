#include "recorder/run_recorder.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "config/torch_alloc.h"
#include "live/process_metrics.h"
#include "recorder/trace_tap.h"
#include "report/exit_verdict.h"
#include "report/output_file.h"
#include "report/report_writer.h"
#include "stacks/symbolizer.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/paths.h"
#include "util/text.h"
#include "util/units.h"

namespace gpushim {
namespace {

constexpr size_t kMaxTimelineSamples = 4096;
constexpr size_t kMaxOomRecords = 16;
// Real out-of-memory errors printed one by one; the total comes at exit.
constexpr uint64_t kLoggedOoms = 16;

}  // namespace

RunRecorder::RunRecorder(Lent lent)
    : lent_(std::move(lent)),
      config_(*lent_.config),
      iterations_(*lent_.iterations),
      timeline_(static_cast<uint64_t>(config_.sample_ms) * 1000000ull, kMaxTimelineSamples),
      // What PyTorch read when its allocator started, about now (config/torch_alloc.h).
      torch_cache_reason_(torch_cache_reason(config_.torch_alloc, getenv(kTorchAllocConf), getenv(kTorchNoCaching))),
      // A relative report name is taken from here, where the trace's was (the program may chdir,
      // even into a directory it deletes before exit).
      start_dir_(working_directory()) {
  if (config_.trace_enabled) {
    StackCapturer* capturer = lent_.capturer;
    trace_owner_ = TraceTap::start(config_, lent_.exe, lent_.pid, lent_.start_ns, lent_.stacks,
                                   [capturer](uint32_t id, FrameInfo* f) { return capturer->resolve_python(id, f); });
    trace_ = trace_owner_.get();
  }
}

RunRecorder::~RunRecorder() = default;

// ---- the run's start and the device table ----

void RunRecorder::start_live_outputs() {
  live_.start(config_, lent_.exe, lent_.pid, policy_name(config_.policy), start_dir_,
              {[this] { return live_device_metrics(); }, [this] { return build_report("snapshot"); }});
}

std::unique_ptr<DeviceMemoryResource> RunRecorder::traced_pool(int ordinal, Backend& capped) {
  return trace_->traced_pool(config_, ordinal, capped);
}

void RunRecorder::device_added(int ordinal, uint64_t capacity, uint64_t limit) {
  if (trace_) trace_->device(ordinal, capacity, limit);
}

// ---- per event ----

void RunRecorder::trace_alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream,
                              bool stream_ordered) {
  if (trace_) trace_->alloc(ptr, rec, request, stream, stream_ordered);
}

void RunRecorder::trace_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream,
                             bool stream_ordered) {
  if (trace_) trace_->free(t_ns, ptr, rec, stream, stream_ordered);
}

void RunRecorder::take_samples(absl::FunctionRef<void(const Sample&)> append) {
  lent_.usage->request();  // the driver's view of usage follows the same clock (Shim::after_hook)
  const uint64_t t = now_ns() - lent_.start_ns;
  lent_.devices([&](const DeviceView& d) {
    append(Sample{t, static_cast<int16_t>(d.ordinal), d.ledger->counters().live_bytes(),
                  d.ledger->figures().reserved_bytes});
  });
  sample_sites(t);
}

void RunRecorder::iteration_marked(uint64_t n) {
  if (iteration_checkpoints_.due(n)) sample_sites(now_ns() - lent_.start_ns, IterationPoint::kMark);
  if (trace_) trace_->iteration(n);
}

void RunRecorder::sample_sites(uint64_t t_ns, IterationPoint at_iteration) {
  // Teardown frees what the program held: its drop must not read as the end of a leak.
  if (teardown_.load(std::memory_order_acquire) != nullptr) return;
  const uint64_t iteration = iterations_.count();
  // A checkpoint goes into the trace only if the history kept it: the trace replays exactly these.
  if (site_history_.sample(t_ns, iteration, lent_.books->sites(), periods_.allocations(), at_iteration) && trace_)
    trace_->checkpoint(t_ns, iteration, iterations_.sources() | checkpoint_flag(at_iteration));
}

// ---- what went wrong ----

void RunRecorder::oom(OomRecord rec, uint64_t limit) {
  // Like injected failures and invalid frees: enough lines to see what fails, never a flood (a
  // program that handles OOMs in a loop); the total comes at exit.
  const uint64_t nth = rec.injected ? 0 : oom_lines_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!rec.injected && nth <= kLoggedOoms)
    // Worded as the summary's line of the same event at exit (report_summary.cpp), less its time and
    // the device's size, so that the two read as one event.
    log_line("out of memory on device %d: requested %s; allocated %s, reserved %s (cached %s, largest free "
             "block %s), device free %s%s%s; returned %s%s",
             rec.device, format_bytes(rec.requested).c_str(), format_bytes(rec.allocated).c_str(),
             format_bytes(rec.pool.reserved_bytes).c_str(), format_bytes(rec.pool.cached_free_bytes).c_str(),
             format_bytes(rec.pool.largest_free_block).c_str(), format_bytes(rec.device_free).c_str(),
             limit ? ", cap " : "", limit ? format_bytes(limit).c_str() : "", rec.returned,
             nth == kLoggedOoms ? " (further out-of-memory errors are counted, and their total printed at exit)" : "");
  if (trace_) trace_->oom(rec);
  std::lock_guard<std::mutex> lock(ooms_mu_);
  if (ooms_.size() >= kMaxOomRecords) return;
  auto sites = lent_.books->sites();
  std::partial_sort(sites.begin(), sites.begin() + std::min<size_t>(5, sites.size()), sites.end(),
                    [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  for (size_t i = 0; i < sites.size() && i < 5; ++i)
    if (sites[i].first.device == rec.device && sites[i].first.kind == MemoryKind::kDevice)
      rec.top_sites.emplace_back(sites[i].first.stack, sites[i].second);
  ooms_.push_back(std::move(rec));
}

void RunRecorder::invalid_free(uintptr_t key, const void* shown, const char* what, const char* returned) {
  // Each warning symbolizes its stack (milliseconds); a program that frees badly in a loop must
  // not be slowed down by its own diagnostics, so only the first ones are printed.
  constexpr uint64_t kMaxWarnings = 20;
  const uint64_t n = invalid_frees_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n > kMaxWarnings) return;
  StackCapturer* capturer = lent_.capturer;
  const StackId id = capturer->capture(/*allocation=*/false);
  std::vector<uint64_t> words;
  lent_.stacks->frames(id, &words);
  Symbolizer sym;
  sym.set_python_resolver([capturer](uint32_t pid, FrameInfo* f) { return capturer->resolve_python(pid, f); });
  auto describe = [&sym](const std::vector<uint64_t>& frames) {
    std::string out;
    for (size_t i = 0; i < frames.size() && i < 4; ++i) {
      const FrameInfo& f = sym.resolve(frames[i]);
      out += (i ? " <- " : "") + (f.function.empty() ? std::string("??") : f.function);
      if (!f.file.empty()) out += " (" + std::string(base_name(f.file)) + ":" + std::to_string(f.line) + ")";
    }
    return out;
  };
  const std::string where = describe(words);
  // A block freed before: where it was allocated and where it was first freed, from the window of
  // recent frees (accounting/recent_frees.h).
  std::string before;
  RecentFrees::Entry prior;
  if (recent_frees_.find(key, &prior)) {
    std::vector<uint64_t> alloc_words;
    lent_.stacks->frames(prior.alloc_stack, &alloc_words);
    const std::string alloc = describe(alloc_words);
    const std::string first_free = prior.free_pc ? describe({prior.free_pc}) : std::string();
    before = "; already freed: allocated (" + std::to_string(prior.size) + " bytes) at " +
             (alloc.empty() ? std::string("unknown (stack capture off)") : alloc) + "; first freed at " +
             (first_free.empty() ? std::string("unknown") : first_free);
  }
  log_line("invalid free of %p (%s); returned %s; caller: %s%s", shown, what, returned,
           where.empty() ? "unknown (stack capture off)" : where.c_str(), before.c_str());
  if (n == kMaxWarnings) log_line("further invalid frees are counted in the report but not printed");
}

void RunRecorder::freed_by_reset(uintptr_t ptr, const AllocationRecord& rec) {
  {
    std::lock_guard<std::mutex> lock(resets_mu_);
    SiteTotals& t = freed_by_reset_[SiteKey{rec.stack, rec.device, rec.kind}];
    t.bytes += rec.size;
    t.count += 1;
  }
  if (trace_) trace_->free(now_ns(), ptr, rec, nullptr, false);
}

void RunRecorder::device_reset(int ordinal) {
  if (ordinal >= 0 && ordinal < Ledgers::kMaxDevices) resets_[ordinal].fetch_add(1, std::memory_order_relaxed);
}

void RunRecorder::context_destroyed(int ordinal) {
  if (ordinal >= 0 && ordinal < Ledgers::kMaxDevices)
    context_destroys_[ordinal].fetch_add(1, std::memory_order_relaxed);
}

// ---- live outputs: the metrics file and snapshots (live/) ----

std::vector<DeviceMetrics> RunRecorder::live_device_metrics() const {
  std::vector<DeviceMetrics> out;
  lent_.devices([&](const DeviceView& d) {
    // The same figures build_report puts in a device entry, without the rest of the report.
    const CounterSnapshot c = d.ledger->counters().snapshot();
    const PoolFigures f = d.ledger->figures();
    DeviceMetrics m;
    m.set_figures(c);
    m.device = d.ordinal;
    m.reserved_bytes = f.reserved_bytes;
    m.peak_reserved_bytes = f.peak_reserved_bytes;
    m.capacity_bytes = d.capacity;
    m.limit_bytes = d.ledger->budget().limit();
    m.failed_allocations = c.failed_allocs;
    m.ooms = f.ooms;
    m.unaccounted_bytes = unaccounted_bytes(d.ordinal);
    out.push_back(m);
  });
  return out;
}

std::optional<uint64_t> RunRecorder::unaccounted_bytes(int ordinal) const {
  // The last driver-usage sample (taken on the allocating threads, never here: this runs on the
  // gpushim-live thread, which must not need a CUDA context).
  const UsageSample u = lent_.usage->last(ordinal);
  if (!u.valid) return std::nullopt;
  return u.used > u.held ? u.used - u.held : 0;
}

void RunRecorder::finish_live_outputs(const ReportData* exit_report) {
  if (!live_.metrics_enabled()) return;
  if (exit_report == nullptr) return live_.write_final_metrics(live_device_metrics());
  std::vector<DeviceMetrics> devices;
  for (const DeviceReport& dr : exit_report->devices) {
    DeviceMetrics m = device_metrics_from_report(dr);
    m.unaccounted_bytes = unaccounted_bytes(dr.device);
    devices.push_back(m);
  }
  live_.write_final_metrics(std::move(devices));
}

void RunRecorder::abandon_in_fork_child() {
  live_.abandon_in_fork_child();                 // its thread does not exist here
  if (trace_) trace_->disable_in_child();        // the parent's trace is the parent's to write
  abandoned_ = true;
}

// ---- the trace's end ----

void RunRecorder::finish_trace() {
  if (abandoned_) return;
  std::vector<trace::DeviceTotals> devices;
  lent_.devices([&](const DeviceView& d) {
    const CounterSnapshot c = d.ledger->counters().snapshot();
    const PoolFigures f = d.ledger->figures();
    trace::DeviceTotals t;
    t.set_figures(c);
    t.ordinal = d.ordinal;
    t.peak_reserved = f.peak_reserved_bytes;
    t.reserved = f.reserved_bytes;
    t.failed_allocs = c.failed_allocs;
    t.ooms = f.ooms;
    t.alloc_retries = f.alloc_retries;
    devices.push_back(t);
  });
  // The exit report's moment when there is one: report and trace then give one duration.
  const uint64_t report_ns = exit_report_ns_.load(std::memory_order_relaxed);
  const LiveSnapshot* teardown = teardown_.load(std::memory_order_acquire);
  trace_->finish(std::move(devices), report_ns ? report_ns : now_ns(), teardown ? teardown->t_ns : 0);
}

// ---- reports ----

ReportData RunRecorder::build_report(const char* reason) {
  ReportSources in;
  in.pid = lent_.pid;
  in.exe = lent_.exe;
  in.policy = policy_name(config_.policy);
  in.reason = reason;
  in.start_ns = lent_.start_ns;
  in.stack_depth = static_cast<int>(config_.stack_depth);
  in.fail_spec = config_.fail.text;
  in.books = lent_.books;
  lent_.devices([&](const DeviceView& d) {
    in.devices.push_back(DeviceSource{d.ledger, d.capacity, resets_[d.ordinal].load(std::memory_order_relaxed),
                                      context_destroys_[d.ordinal].load(std::memory_order_relaxed)});
  });
  in.teardown = teardown_.load(std::memory_order_acquire);
  in.usage = lent_.usage;
  // The present is the last growth checkpoint, so that the verdict covers the run up to this
  // report (after interpreter shutdown began, sample_sites takes none: that checkpoint was the
  // last). Never older than the latest instant kept, which the history would refuse: the series
  // would then end before the report's own figures.
  const uint64_t t = in.teardown ? in.teardown->t_ns : now_ns() - lent_.start_ns;
  sample_sites(std::max(t, site_history_.last_instant_ns()));
  in.history = &site_history_;
  in.evidence.samples = site_history_.samples();
  in.evidence.iterations = iterations_.count();
  in.evidence.iteration_sources = iterations_.sources();
  // No marks: the iterations of the loop, if the allocation sequence repeats (period_detector.h).
  if (in.evidence.iterations == 0 && config_.stack_depth > 0) in.evidence.detected = periods_.detect();
  {
    std::lock_guard<std::mutex> lock(resets_mu_);
    in.freed_by_reset.assign(freed_by_reset_.begin(), freed_by_reset_.end());
  }
  in.timeline = timeline_.samples();
  // Samples are taken by allocations once the interval has passed, so the series would stop at the
  // last one due, up to an interval (or a whole quiet phase) before this report: a run shorter than
  // the interval would show its first allocation only. The report's own instant closes it.
  const uint64_t closing_ns = now_ns() - lent_.start_ns;
  if (in.timeline.empty() || in.timeline.back().t_ns < closing_ns)
    lent_.devices([&](const DeviceView& d) {
      in.timeline.push_back(Sample{closing_ns, static_cast<int16_t>(d.ordinal), d.ledger->counters().live_bytes(),
                                   d.ledger->figures().reserved_bytes});
    });
  {
    std::lock_guard<std::mutex> lock(ooms_mu_);
    in.ooms = ooms_;
  }
  in.invalid_frees = invalid_frees_.load(std::memory_order_relaxed);
  in.host_bytes = lent_.host_bytes();
  in.reserved_va_bytes = lent_.vmm->reserved_va_bytes();
  in.stacks = lent_.stacks;
  in.modules = lent_.modules;
  // Sites whose stacks symbolize identically are merged by the builder (report_builder.cpp).
  Symbolizer sym;
  StackCapturer* capturer = lent_.capturer;
  ModuleMap* modules = lent_.modules;
  sym.set_python_resolver([capturer](uint32_t id, FrameInfo* f) { return capturer->resolve_python(id, f); });
  // The loaded set is pinned at the first native frame the report names: after its stacks were
  // gathered (a snapshot's program runs on), before the symbolizer loads libdw and its dependencies.
  std::optional<ModuleMap::View> loaded_now;
  sym.set_module_resolver([modules, loaded_now](uint64_t address, std::string* path, uint64_t* base) mutable {
    if (!loaded_now) loaded_now = modules->view();
    uintptr_t b = 0;
    const bool found = modules->describe_unloaded(*loaded_now, static_cast<uintptr_t>(address), path, &b);
    *base = b;
    return found;
  });
  in.symbolizer = &sym;
  in.python_status = capturer->python_status();
  in.torch_cache_reason = torch_cache_reason_;
  return gpushim::build_report(in);
}

void RunRecorder::write_exit_report() {
  if (abandoned_) return;
  // exit() while a termination signal's report is being written waits for it: the file is whole.
  std::lock_guard<std::mutex> lock(report_mu_);
  if (reported_.exchange(true)) return;
  if (const uint64_t ooms = oom_lines_.load(std::memory_order_relaxed); ooms > kLoggedOoms)
    log_line("%llu out-of-memory errors in all (%llu not printed above; every one is counted in the report)",
             static_cast<unsigned long long>(ooms), static_cast<unsigned long long>(ooms - kLoggedOoms));
  // No snapshot or metrics update from here on. Inside the dynamic loader (exit() from a library's
  // constructor during dlopen) a snapshot may wait for the loader's lock this thread holds:
  // waiting for it would hang the host for good, and a report built beside it would race it. The
  // host ends without a report instead (LiveOutputs::stop).
  if (!live_.stop()) {
    log_line("no report: exit() was called inside the dynamic loader (from a library's constructor or destructor, "
             "during dlopen or dlclose), whose lock a snapshot being written waits for; snapshot files already "
             "written are whole");
    return;
  }
  // The exit verdict needs the report's figures even when neither the file nor the summary is
  // wanted: a CI job's quiet setup (GPUSHIM_REPORT=off GPUSHIM_SUMMARY=0) must still fail a leak.
  if (!config_.report_enabled && config_.summary_sites == 0 && config_.exit_code == 0)
    return finish_live_outputs(nullptr);
  const ReportData report = build_report("exit");
  exit_report_ns_.store(lent_.start_ns + static_cast<uint64_t>(report.duration_s * 1e9), std::memory_order_relaxed);
  finish_live_outputs(&report);
  std::string path;
  if (config_.report_enabled) {
    const std::string asked =
        anchored_at(expand_path_template(config_.report_template, std::string(base_name(lent_.exe)), lent_.pid),
                    start_dir_);
    path = write_new_file(asked, report_to_json(report), where_allowed(config_.report_template));
    // The summary names the file it wrote; without it, a report that found its name taken (and
    // took the next free one beside it) would not be where the user looks. (One written elsewhere,
    // the asked folder being unwritable, has a line of its own already.)
    const auto folder = [](const std::string& p) { return p.substr(0, p.rfind('/') + 1); };
    if (!path.empty() && path != asked && folder(path) == folder(asked) && config_.summary_sites == 0)
      log_line("report written to %s (%s was taken)", printable(path).c_str(), printable(asked).c_str());
  }
  if (!path.empty()) {
    report_path_ = path;
    report_published_.store(report_path_.c_str(), std::memory_order_release);
  }
  if (config_.summary_sites > 0) write_summary(report, path, config_.summary_sites, stderr);
  // A GPUSHIM_ITERATION_SITE that never counted a call (a misspelt name, a native function that is
  // not an exported symbol, such as main of an executable) would otherwise leave growth on detected
  // iterations, or on none, without a word: the user believes the function counted.
  if (!config_.iteration_site.empty() && (iterations_.sources() & IterationCounter::kSite) == 0)
    log_line("GPUSHIM_ITERATION_SITE=%s counted no call: no allocation ran inside a Python function of that "
             "name, nor inside a native one found by it (a native one must be an exported symbol of a library "
             "loaded at the first CUDA call: an executable's main is not, unless linked with -rdynamic); "
             "growth.iteration_source is %s",
             printable(config_.iteration_site).c_str(), report.growth.iteration_source.c_str());
  if (config_.exit_code != 0) {
    const std::string why = exit_verdict(report, config_.exit_leak_bytes);
    if (!why.empty()) {
      verdict_failed_.store(true, std::memory_order_relaxed);
      log_line("run failed the GPUSHIM_EXIT_CODE checks: %s; exit status %d unless the program fails itself",
               why.c_str(), config_.exit_code);
    }
  }
}

int RunRecorder::exit_status(int status) const {
  // What the parent sees is the low byte: exit(256) is a success too.
  if ((status & 0xff) != 0 || config_.exit_code == 0 || !verdict_failed_.load(std::memory_order_relaxed)) return status;
  return config_.exit_code;
}

void RunRecorder::finish_run() {
  write_exit_report();
  if (trace_ && !trace_finished_.exchange(true)) finish_trace();
}

void RunRecorder::on_unload() {
  write_exit_report();
  // After the report: frees made during teardown still go into the trace.
  if (trace_ && !trace_finished_.exchange(true)) finish_trace();
  const uint64_t late = late_frees_.load(std::memory_order_relaxed);
  if (late && !abandoned_)
    log_line("%llu frees arrived after the report was written (during teardown); accepted",
             static_cast<unsigned long long>(late));
}

void RunRecorder::on_interpreter_shutdown() {
  if (abandoned_ || teardown_.load(std::memory_order_acquire) != nullptr) return;
  const uint64_t t = now_ns() - lent_.start_ns;
  sample_sites(t);  // the last point of every growth series: the program's end
  std::vector<const DeviceLedger*> ledgers;
  lent_.devices([&](const DeviceView& d) { ledgers.push_back(d.ledger); });
  auto* td = new LiveSnapshot(read_live_moment(*lent_.books, ledgers, t));
  teardown_.store(td, std::memory_order_release);
}

}  // namespace gpushim
