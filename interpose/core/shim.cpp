#include "core/shim.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "cuda/capture_state.h"
#include "cuda/driver_backend.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "policy/policy_factory.h"
#include "live/termination_signals.h"
#include "python/interpreter_shutdown.h"
#include "report/exit_verdict.h"
#include "report/oom_advice.h"
#include "report/output_file.h"
#include "report/report_builder.h"
#include "report/report_writer.h"
#include "stacks/native_stack.h"
#include "stacks/site_identity.h"
#include "stacks/symbolizer.h"
#include "util/log.h"
#include "util/paths.h"
#include "util/units.h"

extern char** environ;

namespace gpushim {
namespace {

// kDetached: a fork child of a process that used CUDA. CUDA cannot work there and the inherited
// state belongs to the parent, so every call forwards and the child writes nothing.
enum State : int { kUninitialized = 0, kReady = 1, kDisabled = 2, kDetached = 3 };
std::atomic<int> g_state{kUninitialized};
std::atomic<Shim*> g_instance{nullptr};
std::mutex g_init_mu;
constexpr size_t kMaxTimelineSamples = 4096;
constexpr size_t kMaxOomRecords = 16;
// The thread running initialization; its re-entrant CUDA calls (if any) must forward untouched.
thread_local bool t_initializing = false;

// The shim never destroys its instance: frees that arrive from static destructors after the
// report must still find valid state.
alignas(Shim) unsigned char g_storage[sizeof(Shim)];

// Address range of this library, so that captured stacks start at the caller, whatever inlining
// did to the number of shim frames.
uintptr_t g_self_begin = 0, g_self_end = 0;

void find_own_range() {
  struct Ctx {
    uintptr_t probe, begin, end;
  } ctx{reinterpret_cast<uintptr_t>(&find_own_range), UINTPTR_MAX, 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Ctx*>(data);
        uintptr_t begin = UINTPTR_MAX, end = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          begin = std::min<uintptr_t>(begin, info->dlpi_addr + ph.p_vaddr);
          end = std::max<uintptr_t>(end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        if (c->probe < begin || c->probe >= end) return 0;
        c->begin = begin;
        c->end = end;
        return 1;
      },
      &ctx);
  if (ctx.end > ctx.begin) g_self_begin = ctx.begin, g_self_end = ctx.end;
}

std::string read_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "unknown";
  return std::string(buf, static_cast<size_t>(n));
}

void exit_handler() {
  if (Shim* s = Shim::existing()) s->write_exit_report();
}

// The status the program passed to exit(), for GPUSHIM_EXIT_CODE; -1 until exit().
std::atomic<int> g_exit_status{-1};

void exit_handler_with_status(int status, void*) {
  g_exit_status.store(status, std::memory_order_relaxed);
  exit_handler();
}

void termination_signal_report() {
  if (Shim* s = Shim::existing()) s->finish_run();
}

void interpreter_shutdown_begins() {
  if (Shim* s = Shim::existing()) s->on_interpreter_shutdown();
}

}  // namespace

Shim* Shim::existing() { return g_instance.load(std::memory_order_acquire); }

Shim* Shim::get_slow() {
  const int state = g_state.load(std::memory_order_acquire);
  if (state == kReady) return g_instance.load(std::memory_order_relaxed);
  if (state == kDisabled || state == kDetached || t_initializing) return nullptr;
  return slow_init();
}

Shim* Shim::slow_init() {
  // The fork handlers are registered already (at load), so a fork during initialization waits
  // for this lock in its prepare handler instead of copying it held.
  std::lock_guard<std::mutex> lock(g_init_mu);
  const int state = g_state.load(std::memory_order_acquire);
  if (state == kReady) return g_instance.load(std::memory_order_relaxed);
  if (state == kDisabled || state == kDetached) return nullptr;
  t_initializing = true;
  ConfigResult parsed = parse_config(environ);
  if (!parsed.ok()) {
    // One line per error, as the README promises: each says the shim is off.
    for (const ConfigError& e : parsed.errors)
      log_line("%s; gpushim is off (CUDA calls pass through untouched)", e.message().c_str());
    g_state.store(kDisabled, std::memory_order_release);
    t_initializing = false;
    return nullptr;
  }
  find_own_range();
  if (parsed.config.stack_depth > 0 && !init_native_unwinder()) parsed.config.stack_depth = 0;
  Shim* shim = new (g_storage) Shim(std::move(parsed.config), read_exe());
  // What PyTorch read when its allocator started, about now (config/torch_alloc.h).
  shim->torch_cache_reason_ = torch_cache_reason(shim->config_.torch_alloc, getenv(kTorchAllocConf), getenv(kTorchNoCaching));
  g_instance.store(shim, std::memory_order_release);
  // Registered now, after the CUDA runtime loaded, so it runs before the runtime's own teardown.
  // on_exit (glibc) also gives the exit status, which GPUSHIM_EXIT_CODE may replace.
#if defined(__GLIBC__)
  on_exit(exit_handler_with_status, nullptr);
#else
  std::atexit(exit_handler);
#endif
  at_quick_exit(exit_handler);
  g_state.store(kReady, std::memory_order_release);
  ready_.store(shim, std::memory_order_release);
  shim->start_live_outputs();
  arm_interpreter_shutdown_hook(&interpreter_shutdown_begins);  // Python programs only
  install_termination_report(&termination_signal_report);
  t_initializing = false;
  return shim;
}

Shim::Shim(Config config, std::string exe)
    : config_(std::move(config)),
      exe_(std::move(exe)),
      start_ns_(now_ns()),
      pid_(getpid()),
      timeline_(static_cast<uint64_t>(config_.sample_ms) * 1000000ull, kMaxTimelineSamples),
      capturer_(StackCaptureOptions{config_.stack_depth, config_.python_stacks, config_.iteration_site, g_self_begin,
                                    g_self_end},
                &stacks_, &iterations_),
      faults_(config_.fail) {
  for (auto& t : release_thresholds_) t.store(UINT64_MAX, std::memory_order_relaxed);
  if (config_.trace_enabled) {
    trace_owner_ = TraceTap::start(config_, exe_, pid_, start_ns_, &stacks_,
                                   [this](uint32_t id, FrameInfo* f) { return capturer_.resolve_python(id, f); });
    trace_ = trace_owner_.get();
  }
}

// ---- fork ----
//
// No lock of the shim's is held across fork. Taking them in a prepare handler would make fork wait
// for threads inside the shim, and those may be waiting for the CUDA driver, whose own prepare
// handler (registered after ours, so run before it) already holds the driver's locks: the parent
// would deadlock. Instead the child never touches the parent's state. The shim exists only in a
// process that made a CUDA call, and CUDA cannot work in the fork child of such a process, so the
// child detaches: every call forwards (CUDA answers with its own error) and nothing is written. A
// child forked before its parent's first CUDA call finds no shim and builds its own, like any
// process after exec. Only the initialization lock is held across fork; it is never held around a
// CUDA call.

// Registered when the library is loaded (before main, one thread), not at the first CUDA call:
// registered under the initialization lock there, a fork that another thread began just before
// the registration ran no handler and copied the lock held, and the child's first CUDA call then
// waited for it forever (tests/e2e/programs/fork_during_init.cpp). Before the first CUDA call the
// handlers only lock and unlock an idle mutex. Inherited by fork children: registered once.
const bool Shim::fork_handlers_registered_ =
    pthread_atfork(&Shim::fork_prepare, &Shim::fork_parent, &Shim::fork_child) == 0;

void Shim::fork_prepare() { g_init_mu.lock(); }

void Shim::fork_parent() { g_init_mu.unlock(); }

void Shim::fork_child() {
  g_init_mu.unlock();
  Shim* s = existing();
  if (s == nullptr) return;  // never initialized, disabled, or detached already
  s->live_.abandon_in_fork_child();  // its thread does not exist here
  if (s->trace_) s->trace_->disable_in_child();  // the parent's trace is the parent's to write
  s->forked_child_ = true;
  restore_termination_signals();
  ready_.store(nullptr, std::memory_order_release);
  g_instance.store(nullptr, std::memory_order_release);
  g_state.store(kDetached, std::memory_order_release);
}

// ---- devices ----

DeviceState* Shim::create_device(int ordinal) {
  // Built outside devices_mu_: it calls into the driver (cuInit, context retain), whose own locks
  // a fork handler may hold while ours waits for devices_mu_. Holding devices_mu_ across driver
  // calls would invert that order and could deadlock a fork.
  std::unique_ptr<DeviceState> fresh = make_device(ordinal);
  std::lock_guard<std::mutex> lock(devices_mu_);
  DeviceState* d = devices_[ordinal].load(std::memory_order_relaxed);
  if (d) return d;  // another thread won; ours is dropped (its context retain is harmless)
  d = fresh.release();
  if (trace_) trace_->device(d->ordinal, d->capacity, d->ledger.budget().limit());
  books_.add(&d->ledger);  // before the device is published (Ledgers::add says why)
  devices_[ordinal].store(d, std::memory_order_release);
  // The driver's view of a new device is sampled on its next allocation (unaccounted memory).
  usage_pending_.fetch_or(1ull << ordinal, std::memory_order_relaxed);
  return d;
}

std::unique_ptr<DeviceState> Shim::make_device(int ordinal) {
  auto d = std::make_unique<DeviceState>(ordinal, books_.records());
  // Asked of the device, not of a context: a device first seen through a driver-API program's own
  // context must not get a primary context created for it (that costs hundreds of MB).
  d->capacity = device_total_memory(ordinal);
  if (config_.policy != PolicyKind::kPassthrough) {
    auto driver = std::make_unique<DriverBackend>(ordinal);
    if (driver_api() != nullptr) {
      Backend& capped = d->ledger.capped(*driver);
      d->pool = trace_ ? trace_->traced_pool(config_, ordinal, capped) : make_pool(config_, capped);
      d->ledger.serve_with(d->pool.get());
      d->driver = std::move(driver);
    }
  }
  if (config_.limit.active()) {
    const uint64_t limit = config_.limit.resolve(d->capacity);
    d->ledger.set_limit(limit);
    if (d->capacity != 0 && limit > d->capacity)
      log_line("GPUSHIM_LIMIT (%s) is above device %d's capacity (%s); the device is the limit",
               format_bytes(limit).c_str(), ordinal, format_bytes(d->capacity).c_str());
  }
  return d;
}

DeviceState* Shim::current_device_state() {
  const RealRuntime& rt = real_runtime();
  int dev = 0;
  if (rt.cudaGetDevice == nullptr || rt.cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  return device(dev);
}

bool Shim::stream_capturing(CUstream stream) {
  // Cheap when no capture runs anywhere, which is almost always.
  if (active_captures().load(std::memory_order_acquire) == 0) return false;
  const RealRuntime& rt = real_runtime();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (rt.cudaStreamIsCapturing == nullptr ||
      rt.cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess)
    return false;
  return status == cudaStreamCaptureStatusActive;
}

bool Shim::capture_forbids_unsafe_call() {
  if (active_captures().load(std::memory_order_acquire) == 0) return false;  // almost always
  const auto probe = real_driver().cuMemFree_v2;
  return probe != nullptr && probe(0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

bool Shim::pool_contains(const void* ptr) const {
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (d && d->pool && d->pool->contains(ptr)) return true;
  }
  return false;
}

cudaError_t Shim::mem_get_info(size_t* free, size_t* total) {
  const RealRuntime& rt = real_runtime();
  if (rt.cudaMemGetInfo == nullptr) return cudaErrorInitializationError;
  // The real call first, with the caller's pointers, so that CUDA decides every error code.
  const cudaError_t err = rt.cudaMemGetInfo(free, total);
  if (err != cudaSuccess) return err;
  DeviceState* d = current_device_state();
  const uint64_t limit = d ? d->ledger.budget().limit() : 0;
  if (limit == 0) return err;
  size_t real_free = 0, real_total = 0;
  if (rt.cudaMemGetInfo(&real_free, &real_total) != cudaSuccess) return err;
  apply_cap(limit, d->ledger.budget().held(), real_free, real_total, free, total);
  return err;
}

void Shim::apply_cap(uint64_t limit, uint64_t held, size_t real_free, size_t real_total, size_t* free, size_t* total) {
  if (limit == 0 || limit >= real_total) return;
  // Under the cap the device looks `limit` big: free is what the cap still allows, and never
  // more than the device really has.
  const uint64_t allowed = held >= limit ? 0 : limit - held;
  if (free) *free = static_cast<size_t>(allowed < real_free ? allowed : real_free);
  if (total) *total = static_cast<size_t>(limit);
}

uint64_t Shim::host_bytes() const {
  uint64_t n = stacks_.memory_bytes() + books_.records().memory_bytes() + capturer_.memory_bytes() +
               site_history_.memory_bytes();
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (d == nullptr) continue;
    n += sizeof(DeviceState) + d->ledger.host_bytes();
  }
  return n;
}

void Shim::on_oom(DeviceState* d, uint64_t requested, StackId stack, bool injected) {
  d->ledger.count_oom();
  OomRecord rec;
  rec.injected = injected;
  rec.t_ns = now_ns() - start_ns_;
  rec.device = d->ordinal;
  rec.requested = requested;
  rec.stack = stack;
  rec.pool = pool_figures(d);
  rec.allocated = d->ledger.counters().live_bytes();
  size_t free = 0, total = 0;
  int current = -1;
  // The caller's own context first (the real driver: our cuMemGetInfo hook would show the capped
  // figure); the pool's context only after that, since asking through it may have to create it.
  if (current_context_device(&current) && current == d->ordinal && real_driver().cuMemGetInfo_v2 &&
      real_driver().cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS)
    rec.device_free = free;
  else if (d->driver && d->driver->mem_info(&free, &total) == CUDA_SUCCESS) rec.device_free = free;
  else if (real_runtime().cudaMemGetInfo && real_runtime().cudaMemGetInfo(&free, &total) == cudaSuccess)
    rec.device_free = free;
  if (total != 0) usage_.record(d->ordinal, UsageSample{true, now_ns(), total - free, d->ledger.held_from_driver()});
  // Like injected failures and invalid frees: enough lines to see what fails, never a flood (a
  // program that handles OOMs in a loop); the total comes at exit.
  constexpr uint64_t kLoggedOoms = 16;
  const uint64_t nth = injected ? 0 : oom_lines_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!injected && nth <= kLoggedOoms)
    log_line("out of memory on device %d: %s requested; allocated %s, reserved %s (%s cached free, largest free "
           "block %s), device free %s%s%s; returned cudaErrorMemoryAllocation%s",
           d->ordinal, format_bytes(requested).c_str(), format_bytes(rec.allocated).c_str(),
           format_bytes(rec.pool.reserved_bytes).c_str(), format_bytes(rec.pool.cached_free_bytes).c_str(),
           format_bytes(rec.pool.largest_free_block).c_str(), format_bytes(rec.device_free).c_str(),
           d->ledger.budget().limit() ? ", cap " : "",
           d->ledger.budget().limit() ? format_bytes(d->ledger.budget().limit()).c_str() : "",
           nth == kLoggedOoms ? " (further out-of-memory errors are counted, and their total printed at exit)" : "");
  if (trace_) trace_->oom(rec);
  std::lock_guard<std::mutex> lock(ooms_mu_);
  if (ooms_.size() >= kMaxOomRecords) return;
  auto sites = this->sites();
  std::partial_sort(sites.begin(), sites.begin() + std::min<size_t>(5, sites.size()), sites.end(),
                    [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  for (size_t i = 0; i < sites.size() && i < 5; ++i)
    if (sites[i].first.device == d->ordinal && sites[i].first.kind == MemoryKind::kDevice)
      rec.top_sites.emplace_back(sites[i].first.stack, sites[i].second);
  ooms_.push_back(std::move(rec));
}

// ---- GPUSHIM_FAIL ----
// An allocation the FaultInjector selected fails before any pool or the real call sees it (Shim::inject),
// and is accounted and reported like a real out-of-memory error.

namespace {
// Enough lines to see what is failing; a random:0.5 run over millions of calls must not flood stderr.
constexpr uint64_t kLoggedInjections = 16;
}  // namespace

void Shim::note_injected_failure(DeviceState* d, uint64_t requested, uint64_t number, const char* returned) {
  const StackId stack = capture_stack();
  d->ledger.failed_on_purpose();
  const uint64_t nth_injection = faults_.injected();
  if (nth_injection <= kLoggedInjections)
    log_line("injected allocation failure (GPUSHIM_FAIL=%s): allocation %llu, %s on device %d; returned %s%s",
             faults_.spec().text.c_str(), static_cast<unsigned long long>(number), format_bytes(requested).c_str(),
             d->ordinal, returned,
             nth_injection == kLoggedInjections ? " (further injections are counted in the report only)" : "");
  on_oom(d, requested, stack, /*injected=*/true);
}


// ---- stacks ----

StackId Shim::capture_stack() {
  const StackId id = capturer_.capture();
  if (config_.stack_depth > 0) periods_.on_allocation(id);
  return id;
}

void Shim::warn_invalid_free(const void* ptr, const char* what) {
  // Each warning symbolizes its stack (milliseconds); a program that frees badly in a loop must
  // not be slowed down by its own diagnostics, so only the first ones are printed.
  constexpr uint64_t kMaxWarnings = 20;
  const uint64_t n = invalid_frees_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n > kMaxWarnings) return;
  const StackId id = capturer_.capture(/*allocation=*/false);
  std::vector<uint64_t> words;
  stacks_.frames(id, &words);
  Symbolizer sym;
  sym.set_python_resolver([this](uint32_t pid, FrameInfo* f) { return capturer_.resolve_python(pid, f); });
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
  if (recent_frees_.find(reinterpret_cast<uintptr_t>(ptr), &prior)) {
    std::vector<uint64_t> alloc_words;
    stacks_.frames(prior.alloc_stack, &alloc_words);
    const std::string alloc = describe(alloc_words);
    const std::string first_free = prior.free_pc ? describe({prior.free_pc}) : std::string();
    before = "; already freed: allocated (" + std::to_string(prior.size) + " bytes) at " +
             (alloc.empty() ? std::string("unknown (stack capture off)") : alloc) + "; first freed at " +
             (first_free.empty() ? std::string("unknown") : first_free);
  }
  log_line("invalid free of %p (%s); returned cudaErrorInvalidValue; caller: %s%s", ptr, what,
           where.empty() ? "unknown (stack capture off)" : where.c_str(), before.c_str());
  if (n == kMaxWarnings) log_line("further invalid frees are counted in the report but not printed");
}

// ---- live outputs: the metrics file and snapshots (live/) ----

void Shim::start_live_outputs() {
  live_.start(config_, exe_, pid_, policy_name(config_.policy),
              {[this] { return live_device_metrics(); }, [this] { return build_report("snapshot"); }});
}

std::vector<DeviceMetrics> Shim::live_device_metrics() const {
  std::vector<DeviceMetrics> out;
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (!d) continue;
    // The same figures build_report puts in a device entry, without the rest of the report.
    const CounterSnapshot c = d->ledger.counters().snapshot();
    const PoolFigures f = pool_figures(d);
    DeviceMetrics m;
    m.device = d->ordinal;
    m.allocated_bytes = c.live_bytes;
    m.reserved_bytes = f.reserved_bytes;
    m.peak_allocated_bytes = c.peak_bytes;
    m.peak_reserved_bytes = f.peak_reserved_bytes;
    m.capacity_bytes = d->capacity;
    m.limit_bytes = d->ledger.budget().limit();
    m.live_allocations = c.live_count;
    m.allocations = c.total_allocs;
    m.frees = c.total_frees;
    m.failed_allocations = c.failed_allocs;
    m.ooms = f.ooms;
    m.unaccounted_bytes = unaccounted_bytes(*d);
    out.push_back(m);
  }
  return out;
}

std::optional<uint64_t> Shim::unaccounted_bytes(const DeviceState& d) const {
  // The last driver-usage sample (taken on the allocating threads, never here: this runs on the
  // gpushim-live thread, which must not need a CUDA context).
  const UsageSample u = usage_.last(d.ordinal);
  if (!u.valid) return std::nullopt;
  return u.used > u.held ? u.used - u.held : 0;
}

void Shim::finish_live_outputs(const ReportData* exit_report) {
  if (!live_.metrics_enabled()) return;
  if (exit_report == nullptr) return live_.write_final_metrics(live_device_metrics());
  std::vector<DeviceMetrics> devices;
  for (const DeviceReport& dr : exit_report->devices) {
    DeviceMetrics m = device_metrics_from_report(dr);
    if (const DeviceState* d = existing_device(dr.device)) m.unaccounted_bytes = unaccounted_bytes(*d);
    devices.push_back(m);
  }
  live_.write_final_metrics(std::move(devices));
}

// ---- iterations, growth checkpoints and the trace's end ----

uint64_t Shim::on_iteration_mark() {
  const uint64_t n = iterations_.add(IterationCounter::kMark);
  if (iteration_checkpoints_.due(n)) sample_sites(now_ns() - start_ns_);
  if (trace_) trace_->iteration(n);
  return n;
}

void Shim::sample_sites(uint64_t t_ns) {
  // Teardown frees what the program held: its drop must not read as the end of a leak.
  if (teardown_.load(std::memory_order_acquire) != nullptr) return;
  const uint64_t iteration = iterations_.count();
  // A checkpoint goes into the trace only if the history kept it: the trace replays exactly these.
  if (site_history_.sample(t_ns, iteration, sites(), periods_.allocations()) && trace_)
    trace_->checkpoint(t_ns, iteration, iterations_.sources());
}

void Shim::finish_trace() {
  if (forked_child_) return;
  std::vector<trace::DeviceTotals> devices;
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (!d) continue;
    const CounterSnapshot c = d->ledger.counters().snapshot();
    const PoolFigures f = pool_figures(d);
    trace::DeviceTotals t;
    t.ordinal = d->ordinal;
    t.live_bytes = c.live_bytes;
    t.live_count = c.live_count;
    t.peak_allocated = c.peak_bytes;
    t.peak_reserved = f.peak_reserved_bytes;
    t.total_allocs = c.total_allocs;
    t.total_frees = c.total_frees;
    t.failed_allocs = c.failed_allocs;
    t.ooms = f.ooms;
    devices.push_back(t);
  }
  // The exit report's moment when there is one: report and trace then give one duration.
  const uint64_t report_ns = exit_report_ns_.load(std::memory_order_relaxed);
  trace_->finish(std::move(devices), report_ns ? report_ns : now_ns());
}

// ---- reports ----

ReportData Shim::build_report(const char* reason) {
  ReportSources in;
  in.pid = pid_;
  in.exe = exe_;
  in.policy = policy_name(config_.policy);
  in.reason = reason;
  in.start_ns = start_ns_;
  in.stack_depth = static_cast<int>(config_.stack_depth);
  in.fail_spec = config_.fail.text;
  in.books = &books_;
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (d == nullptr) continue;
    in.devices.push_back(DeviceSource{&d->ledger, d->capacity, d->resets.load(std::memory_order_relaxed),
                                      d->context_destroys.load(std::memory_order_relaxed)});
  }
  in.teardown = teardown_.load(std::memory_order_acquire);
  in.usage = &usage_;
  // The present is the last growth checkpoint, so that the verdict covers the run up to this
  // report (after interpreter shutdown began, sample_sites takes none: that checkpoint was the
  // last). Never older than the latest instant kept, which the history would refuse: the series
  // would then end before the report's own figures.
  const uint64_t t = in.teardown ? in.teardown->t_ns : now_ns() - start_ns_;
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
  {
    std::lock_guard<std::mutex> lock(ooms_mu_);
    in.ooms = ooms_;
  }
  in.invalid_frees = invalid_frees_.load(std::memory_order_relaxed);
  in.host_bytes = host_bytes();
  in.reserved_va_bytes = vmm_.reserved_va_bytes();
  in.stacks = &stacks_;
  in.modules = &modules_;
  // Sites whose stacks symbolize identically are merged by the builder (report_builder.cpp).
  Symbolizer sym;
  sym.set_python_resolver([this](uint32_t id, FrameInfo* f) { return capturer_.resolve_python(id, f); });
  sym.set_module_resolver([this](uint64_t address, std::string* path, uint64_t* base) {
    uintptr_t b = 0;
    const bool found = modules_.describe(static_cast<uintptr_t>(address), path, &b);
    *base = b;
    return found;
  });
  in.symbolizer = &sym;
  in.python_status = capturer_.python_status();
  in.torch_cache_reason = torch_cache_reason_;
  return gpushim::build_report(in);
}

void Shim::write_exit_report() {
  if (forked_child_) return;
  // exit() while a termination signal's report is being written waits for it: the file is whole.
  std::lock_guard<std::mutex> lock(report_mu_);
  if (reported_.exchange(true)) return;
  if (const uint64_t ooms = oom_lines_.load(std::memory_order_relaxed); ooms > 16)
    log_line("%llu out-of-memory errors in all (%llu not printed above; every one is counted in the report)",
             static_cast<unsigned long long>(ooms), static_cast<unsigned long long>(ooms - 16));
  live_.stop();  // no snapshot or metrics update from here on
  // The exit verdict needs the report's figures even when neither the file nor the summary is
  // wanted: a CI job's quiet setup (GPUSHIM_REPORT=off GPUSHIM_SUMMARY=0) must still fail a leak.
  if (!config_.report_enabled && config_.summary_sites == 0 && config_.exit_code == 0)
    return finish_live_outputs(nullptr);
  const ReportData report = build_report("exit");
  exit_report_ns_.store(start_ns_ + static_cast<uint64_t>(report.duration_s * 1e9), std::memory_order_relaxed);
  finish_live_outputs(&report);
  std::string path;
  if (config_.report_enabled)
    path = write_new_file(expand_path_template(config_.report_template, std::string(base_name(exe_)), pid_),
                          report_to_json(report), where_allowed(config_.report_template));
  if (config_.summary_sites > 0) write_summary(report, path, config_.summary_sites, stderr);
  if (config_.exit_code != 0) {
    const std::string why = exit_verdict(report, config_.exit_leak_bytes);
    if (!why.empty()) {
      verdict_failed_.store(true, std::memory_order_relaxed);
      log_line("run failed the GPUSHIM_EXIT_CODE checks: %s; exit status %d unless the program fails itself",
               why.c_str(), config_.exit_code);
    }
  }
}

int Shim::exit_status(int status) const {
  if (status != 0 || config_.exit_code == 0 || !verdict_failed_.load(std::memory_order_relaxed)) return status;
  return config_.exit_code;
}

void Shim::finish_run() {
  write_exit_report();
  if (trace_ && !trace_finished_.exchange(true)) finish_trace();
}

void Shim::on_interpreter_shutdown() {
  if (forked_child_ || teardown_.load(std::memory_order_acquire) != nullptr) return;
  const uint64_t t = now_ns() - start_ns_;
  sample_sites(t);  // the last point of every growth series: the program's end
  auto* td = new LiveSnapshot;
  td->t_ns = t;
  td->sites = sites();
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (!d) continue;
    if (td->devices.size() <= static_cast<size_t>(d->ordinal)) {
      td->devices.resize(d->ordinal + 1);
      td->pools.resize(d->ordinal + 1);
    }
    td->devices[d->ordinal] = d->ledger.counters().snapshot();
    td->pools[d->ordinal] = d->ledger.figures();
  }
  books_.records().modules().for_each([&](ModuleId id, int dev, MemoryKind kind, const ModuleTotals& c) {
    const ModuleSnapshot m = c.snapshot();
    if (m.live_count != 0) td->modules.push_back({id, dev, kind, m.live_bytes, m.live_count});
  });
  teardown_.store(td, std::memory_order_release);
}

void Shim::on_unload() {
  write_exit_report();
  // After the report: frees made during teardown still go into the trace.
  if (trace_ && !trace_finished_.exchange(true)) finish_trace();
  const uint64_t late = late_frees_.load(std::memory_order_relaxed);
  if (late && !forked_child_)
    log_line("%llu frees arrived after the report was written (during teardown); accepted",
             static_cast<unsigned long long>(late));
  // GPUSHIM_EXIT_CODE: the last library destructor but the C library's own (preloaded libraries
  // are finalized last), so the program's atexit handlers and destructors have all run. Only
  // stdio's final flush is left, done here.
  const int status = g_exit_status.load(std::memory_order_relaxed);
  if (status >= 0 && !forked_child_ && exit_status(status) != status) {
    std::fflush(nullptr);
    _exit(exit_status(status));
  }
}

}  // namespace gpushim
