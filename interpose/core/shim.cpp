#include "core/shim.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "cuda/capture_state.h"
#include "cuda/driver_backend.h"
#include "cuda/real_driver.h"
#include "cuda/real_symbols.h"
#include "cuda/stream_registry.h"
#include "core/call_context.h"
#include "live/termination_signals.h"
#include "policy/policy_factory.h"
#include "python/interpreter_shutdown.h"
#include "recorder/run_recorder.h"
#include "stacks/native_stack.h"
#include "util/log.h"
#include "util/units.h"
#include "util/dlopen_guard.h"

extern char** environ;

namespace gpushim {
namespace {

// kDetached: a fork child of a process that used CUDA. CUDA cannot work there and the inherited
// state belongs to the parent, so every call forwards and the child writes nothing.
enum State : int { kUninitialized = 0, kReady = 1, kDisabled = 2, kDetached = 3 };
std::atomic<int> g_state{kUninitialized};
std::mutex g_init_mu;
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
  const LoaderScope loader_work;  // a fork waits for it (util/dlopen_guard.h)
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
  if (Shim* s = Shim::existing()) s->on_process_exit();
}

// The status the program passed to exit(), for GPUSHIM_EXIT_CODE; -1 until exit().
std::atomic<int> g_exit_status{-1};

void exit_handler_with_status(int status, void*) {
  g_exit_status.store(status, std::memory_order_relaxed);
  exit_handler();
}

void termination_signal_report() {
  if (Shim* s = Shim::existing()) s->on_termination_signal();
}

void interpreter_shutdown_begins() {
  if (Shim* s = Shim::existing()) s->on_interpreter_shutdown();
}

// os._exit(status), or CPython's death by SIGINT after a KeyboardInterrupt (kNoExitStatus): no
// exit() will follow. Returns the status os._exit is to exit with.
int python_ends_without_exit(int status) {
  Shim* s = Shim::existing();
  if (s == nullptr) return status;
  if (status == kNoExitStatus) {
    s->on_termination_signal();
    return status;
  }
  return s->on_python_exit(status);
}

}  // namespace

Shim* Shim::get_slow() {
  const int state = g_state.load(std::memory_order_acquire);
  if (state == kReady) return instance_.load(std::memory_order_relaxed);
  if (state == kDisabled || state == kDetached || t_initializing) return nullptr;
  return slow_init();
}

Shim* Shim::slow_init() {
  // The fork handlers are registered already (when the front attached the core), so a fork during
  // initialization waits for this lock in its prepare handler instead of copying it held.
  install_fork_handlers();  // a core without a front
  std::lock_guard<std::mutex> lock(g_init_mu);
  const int state = g_state.load(std::memory_order_acquire);
  if (state == kReady) return instance_.load(std::memory_order_relaxed);
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
  for (const std::string& line : parsed.inert) log_line("%s", line.c_str());
  find_own_range();
  if (parsed.config.stack_depth > 0 && !init_native_unwinder()) parsed.config.stack_depth = 0;
  Shim* shim = new (g_storage) Shim(std::move(parsed.config), read_exe());
  instance_.store(shim, std::memory_order_release);
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
  shim->recorder_->start_live_outputs();
  arm_interpreter_shutdown_hook(&interpreter_shutdown_begins, &python_ends_without_exit);  // Python programs only
  install_termination_report(&termination_signal_report);
  t_initializing = false;
  return shim;
}

Shim::Shim(Config config, std::string exe)
    : config_(std::move(config)),
      capturer_(StackCaptureOptions{config_.stack_depth, config_.python_stacks, config_.iteration_site, g_self_begin,
                                    g_self_end},
                &stacks_, &iterations_),
      faults_(config_.fail),
      recorder_(make_recorder(std::move(exe))),
      tracing_(recorder_->tracing()) {
  for (auto& t : release_thresholds_) t.store(UINT64_MAX, std::memory_order_relaxed);
}

RunRecorder* Shim::make_recorder(std::string exe) {
  RunRecorder::Lent lent;
  lent.config = &config_;
  lent.exe = std::move(exe);
  lent.pid = getpid();
  lent.start_ns = now_ns();
  lent.books = &books_;
  lent.stacks = &stacks_;
  lent.capturer = &capturer_;
  lent.modules = &modules_;
  lent.usage = &usage_;
  lent.vmm = &vmm_;
  lent.iterations = &iterations_;
  lent.devices = [this](absl::FunctionRef<void(const RunRecorder::DeviceView&)> fn) {
    for (const auto& slot : devices_)
      if (const DeviceState* d = slot.load(std::memory_order_acquire))
        fn(RunRecorder::DeviceView{d->ordinal, &d->ledger, d->capacity});
  };
  lent.host_bytes = [this] { return host_bytes(); };
  return new RunRecorder(std::move(lent));  // never freed, like the Shim
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

// Registered when the front attaches the core, before any hook runs, not under the initialization
// lock at the first CUDA call: registered there, a fork that another thread began just before the
// registration ran no handler and copied the lock held, and the child's first CUDA call then
// waited for it forever (tests/e2e/programs/fork_during_init.cpp). Through the front, never with
// pthread_atfork while the core is being dlopened: glibc's fork holds its handler lock while the
// front's prepare handler waits for that very load (front/front_api.h). Inherited by fork
// children: registered once. A core used without a front (unit tests) registers at its first
// initialization instead.
void Shim::install_fork_handlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true, std::memory_order_acq_rel)) return;
  register_fork_handlers(&Shim::fork_prepare, &Shim::fork_parent, &Shim::fork_child);
}

void Shim::fork_prepare() { g_init_mu.lock(); }

void Shim::fork_parent() { g_init_mu.unlock(); }

void Shim::fork_child() {
  g_init_mu.unlock();
  stream_registry_after_fork_in_child();
  Shim* s = existing();
  if (s == nullptr) return;  // never initialized, disabled, or detached already
  s->recorder_->abandon_in_fork_child();  // no live thread, trace or report here
  s->forked_child_ = true;
  restore_termination_signals();
  ready_.store(nullptr, std::memory_order_release);
  instance_.store(nullptr, std::memory_order_release);
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
  recorder_->device_added(d->ordinal, d->capacity, d->ledger.budget().limit());
  books_.add(&d->ledger);  // before the device is published (Ledgers::add says why)
  devices_[ordinal].store(d, std::memory_order_release);
  if (d->pool != nullptr) pooled_devices_.fetch_or(1ull << ordinal, std::memory_order_release);
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
      d->pool = tracing_ ? recorder_->traced_pool(ordinal, capped) : make_pool(config_, capped);
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
  // With one device visible (one GPU per process, as data-parallel jobs run) the runtime can name
  // no other: once that device's state exists it is the answer, without asking cudaGetDevice at
  // every allocation (on the simulated device 135 of a pair's ~2,000 instructions). A context the
  // program made is still asked about (route_for_current_context). From the shim's exit handler on
  // the runtime is asked again, so that an allocation after CUDA's teardown (a static destructor)
  // gets CUDA's cudaErrorCudartUnloading. What is given up: another thread allocating between
  // NVIDIA's runtime teardown, whose exit handler runs before ours, and ours gets pooled memory.
  if (DeviceState* d = sole_device_.load(std::memory_order_acquire)) return d;
  const RealRuntime& rt = real_runtime();
  int dev = 0;
  if (rt.cudaGetDevice == nullptr || rt.cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  DeviceState* d = device(dev);
  if (d != nullptr && dev == 0 && !sole_device_off_.load(std::memory_order_acquire) && sole_visible_device()) {
    sole_device_.store(d, std::memory_order_release);
    if (sole_device_off_.load(std::memory_order_acquire)) sole_device_.store(nullptr, std::memory_order_release);
  }
  return d;
}

void Shim::stop_sole_device() {
  sole_device_off_.store(true, std::memory_order_release);
  sole_device_.store(nullptr, std::memory_order_release);
}

int Shim::visible_device_count(bool ask_again) {
  int known = visible_devices_.load(std::memory_order_relaxed);
  if (known >= 0 || (known == kCountRefused && !ask_again)) return known;
  int n = 0;
  const RealDriver& drv = real_driver();
  if (drv.cuDeviceGetCount == nullptr || drv.cuDeviceGetCount(&n) != CUDA_SUCCESS) {
    // Never over an answer another thread got meanwhile.
    visible_devices_.compare_exchange_strong(known, kCountRefused, std::memory_order_relaxed);
    return kCountRefused;
  }
  visible_devices_.store(n, std::memory_order_relaxed);
  return n;
}

int Shim::pooled_device_of(void* ptr, uint64_t devices) {
  AllocationRecord rec;
  for (; devices != 0; devices &= devices - 1) {
    const int dev = __builtin_ctzll(devices);
    DeviceState* d = devices_[dev].load(std::memory_order_acquire);
    if (d != nullptr && d->ledger.find_pooled(reinterpret_cast<uintptr_t>(ptr), &rec))
      return rec.route == Route::kPooled ? dev : -1;
  }
  return -1;
}

int Shim::device_of_created_stream(CUstream stream) {
  learn_stream(stream);
  return device_of_stream(stream);
}

bool Shim::ordered_by_another_device(void* ptr, CUstream stream) {
  const int on = device_of_stream(stream);
  if (on < 0) return false;  // unknown: the pool's rules as for any stream
  // Only the pools of the other devices are asked: a process that pools on one device (one GPU
  // per process, the usual way) makes no lookup here.
  uint64_t others = pooled_devices_.load(std::memory_order_acquire);
  if (on < 64) others &= ~(1ull << on);
  return pooled_device_of(ptr, others) >= 0;
}

bool Shim::is_pooled_block(void* ptr) {
  return pooled_device_of(ptr, pooled_devices_.load(std::memory_order_acquire)) >= 0;
}

void Shim::note_block_freed_in_graph() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    log_line("cudaFreeAsync of memory that is not a graph allocation on a capturing stream: refused with an "
             "invalid-value error, as CUDA refuses it (a free node takes graph memory only); the block stays "
             "allocated. Free it after the capture ends");
}

cudaStreamCaptureStatus Shim::capture_status(CUstream stream) {
  // Cheap when no capture runs anywhere, which is almost always.
  if (active_captures().load(std::memory_order_acquire) == 0) return cudaStreamCaptureStatusNone;
  const RealRuntime& rt = real_runtime();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (rt.cudaStreamIsCapturing == nullptr ||
      rt.cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess)
    return cudaStreamCaptureStatusNone;
  return status;
}

bool Shim::capture_forbids_unsafe_call(int device) {
  if (active_captures().load(std::memory_order_acquire) == 0) return false;  // almost always
  // Trimming a default pool down to "keep everything" frees nothing and needs no current context;
  // CUDA checks it by the same rules as cuMemAlloc, cuMemAllocAsync on another stream and pool
  // queries (an H200: tests/gpu/capture_queries_h200.jsonl). cuMemFree(0), the probe before, answers
  // CUDA_ERROR_INVALID_CONTEXT on a thread with no context and so let such a thread through.
  const RealDriver& drv = real_driver();
  CUmemoryPool pool = default_mempool(device >= 0 && device < kMaxDevices ? device : 0);
  if (pool != nullptr && drv.cuMemPoolTrimTo != nullptr)
    return drv.cuMemPoolTrimTo(pool, SIZE_MAX) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return drv.cuMemFree_v2 != nullptr && drv.cuMemFree_v2(0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

RelaxedCaptureMode::RelaxedCaptureMode() {
  const auto exchange = real_driver().cuThreadExchangeStreamCaptureMode;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (exchange != nullptr && exchange(&mode) == CUDA_SUCCESS) {
    previous_ = mode;
    exchanged_ = true;
  }
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (!exchanged_) return;
  CUstreamCaptureMode mode = previous_;
  real_driver().cuThreadExchangeStreamCaptureMode(&mode);
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
  apply_cap(limit, d->ledger.held_from_driver(), real_free, real_total, free, total);
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
               recorder_->host_bytes();
  for (const auto& slot : devices_) {
    const DeviceState* d = slot.load(std::memory_order_acquire);
    if (d == nullptr) continue;
    n += sizeof(DeviceState) + d->ledger.host_bytes();
  }
  return n;
}

void Shim::on_oom(DeviceState* d, uint64_t requested, StackId stack, const char* returned, bool injected) {
  d->ledger.count_oom();
  OomRecord rec;
  rec.injected = injected;
  rec.returned = returned;
  rec.t_ns = now_ns() - recorder_->start_ns();
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
  recorder_->oom(std::move(rec), d->ledger.budget().limit());
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
  on_oom(d, requested, stack, returned, /*injected=*/true);
}


// ---- stacks ----

StackId Shim::capture_stack_now() {
  const StackId id = capturer_.capture();
  recorder_->stack_captured(id);
  return id;
}

void Shim::warn_invalid_free(const void* ptr, FreeApi api, const char* what, const char* returned) {
  const uintptr_t key = reinterpret_cast<uintptr_t>(ptr);
  recorder_->invalid_free(key, reinterpret_cast<const void*>(api == FreeApi::kArray ? ArrayBooks::handle_of(key) : key),
                          what, returned);
}

// ---- the hot path's hand-off to the recorder ----

void Shim::recorded_trace_alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream,
                                bool stream_ordered) {
  recorder_->trace_alloc(ptr, rec, request, stream, stream_ordered);
}

void Shim::recorded_event(uint64_t t_ns) { recorder_->after_event(t_ns); }

void Shim::recorded_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, bool late_check) {
  recorder_->freed(t_ns, ptr, rec, current_hook_caller(), late_check);
}

void Shim::recorded_late_free() { recorder_->note_late_free(); }

void Shim::recorded_trace_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream,
                               bool stream_ordered) {
  recorder_->trace_free(t_ns, ptr, rec, stream, stream_ordered);
}

// ---- iterations and the run's end ----

uint64_t Shim::on_iteration_mark() {
  const uint64_t n = iterations_.add(IterationCounter::kMark);
  recorder_->iteration_marked(n);
  return n;
}

// exit() on a thread that is inside one of our hooks: a signal handler that interrupted it (or a
// callback the hook's real call ran) called exit(). The hook may hold the pool's or the books'
// locks, which the report would wait for forever (a hang at exit where the program ended at
// once), and the books may be mid-change. Nothing is written; one line says why.
// Also exit() on a thread that is writing the exit report: a signal handler (a timer's, Ctrl-C's)
// that calls exit() while the first exit() runs the shim's handler. The report's lock is this
// thread's own, and waiting for it hung the process for good.
namespace {
thread_local bool t_ending_run = false;  // this thread runs the shim's exit work
// The library destructor ended the run (on_unload). Our exit handler can still come after it: one
// registered by another thread's first CUDA call while exit() was already running the destructors
// (glibc runs handlers registered meanwhile once they return). Nothing is left to do then, and no
// exit() was nested: the "called again" line said so wrongly (2 runs in 210 of a helper's race).
std::atomic<bool> g_run_ended_at_unload{false};
}

bool Shim::exit_inside_hook() {
  if (t_ending_run) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true, std::memory_order_relaxed)) {
      // The report's file may already be whole (the signal came during the summary or the
      // trace's end): say so rather than that there is none.
      if (const char* path = recorder_->report_published())
        log_line("exit() was called again while this thread ended the shim's run (from a signal handler): the "
                 "report is written to %s; no end of the trace", path);
      else
        log_line("exit() was called again while this thread wrote the shim's report (from a signal handler): no "
                 "report and no end of the trace");
    }
    return true;
  }
  if (!may_hold_shim_locks()) return false;
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed))
    log_line("exit() was called inside a CUDA call on this thread (from a signal handler or a callback): no "
             "report and no end of the trace, as the shim's books may be in mid-change there");
  return true;
}

void Shim::on_process_exit() {
  stop_sole_device();
  if (g_run_ended_at_unload.load(std::memory_order_acquire)) return;
  if (exit_inside_hook()) return;
  t_ending_run = true;
  refresh_cuda_pools_for_report();
  recorder_->write_exit_report();
  t_ending_run = false;
}

void Shim::on_termination_signal() {
  refresh_cuda_pools_for_report();
  recorder_->finish_run();
}

int Shim::on_python_exit(int status) {
  on_termination_signal();
  return forked_child_ ? status : recorder_->exit_status(status);
}

void Shim::on_interpreter_shutdown() {
  if (forked_child_) return;
  refresh_cuda_pools_for_report();
  recorder_->on_interpreter_shutdown();
}

void Shim::on_unload() {
  stop_sole_device();
  if (exit_inside_hook()) return;
  t_ending_run = true;  // never cleared: the process ends after the last destructor
  g_run_ended_at_unload.store(true, std::memory_order_release);
  recorder_->on_unload();
  // GPUSHIM_EXIT_CODE: the last library destructor but the C library's own (preloaded libraries
  // are finalized last), so the program's atexit handlers and destructors have all run. Only
  // stdio's final flush is left, done here.
  const int status = g_exit_status.load(std::memory_order_relaxed);
  if (status >= 0 && !forked_child_ && recorder_->exit_status(status) != status) {
    std::fflush(nullptr);
    _exit(recorder_->exit_status(status));
  }
}

}  // namespace gpushim
