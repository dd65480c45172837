// The Shim's side of GPUSHIM_TRACE and of growth: turns what the core sees into trace events, and
// takes the growth checkpoints (which the trace records too). Everything but sample_sites runs only
// when a trace is being recorded (trace_ set); the hot paths call in after one null check.
#include <unistd.h>

#include <cstring>

#include "core/shim.h"
#include "policy/policy_factory.h"
#include "report/output_file.h"
#include "trace/trace_ordered_resource.h"
#include "util/clock.h"
#include "util/log.h"

extern char** environ;

namespace gpushim {
namespace {

using trace::EventKind;
using trace::TraceEvent;

uint8_t event_flags(const AllocationRecord& rec, bool stream_ordered) {
  uint8_t f = static_cast<uint8_t>(rec.kind) & trace::kFlagKindMask;
  if (stream_ordered) f |= trace::kFlagStreamOrdered;
  if (rec.route == Route::kForwarded) f |= trace::kFlagForwarded;
  return f;
}

std::string file_name_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Reports the pool's segments (and vmm mappings) and its reuse moments of one device as trace
// events, numbered in the pool's order like its allocations (the pool calls in while the ordering
// wrapper holds its lock).
class SegmentTracer final : public SegmentObserver {
 public:
  SegmentTracer(trace::TraceRecorder& recorder, int device) : recorder_(recorder), device_(device) {}
  void set_order(trace::TraceOrderedResource* order) { order_ = order; }
  void on_segment(Change change, uintptr_t addr, uint64_t bytes) override {
    TraceEvent e;
    e.t_ns = now_ns();
    e.addr = addr;
    e.size = bytes;
    e.device = static_cast<int16_t>(device_);
    if (order_) {
      e.seq = order_->next_seq_locked();
      e.flags = trace::kFlagSequenced;
    }
    switch (change) {
      case Change::kAlloc: e.kind = EventKind::kSegmentAlloc; break;
      case Change::kFree: e.kind = EventKind::kSegmentFree; break;
      case Change::kMap: e.kind = EventKind::kSegmentMap; break;
      case Change::kUnmap: e.kind = EventKind::kSegmentUnmap; break;
    }
    recorder_.record(e);
  }
  void on_reuse(Reuse what, uint64_t ordinal, uint64_t queries_before) override {
    TraceEvent e;
    e.t_ns = now_ns();
    e.kind = EventKind::kReuse;
    e.requested = static_cast<uint64_t>(what);
    e.size = ordinal;
    e.addr = queries_before;
    e.device = static_cast<int16_t>(device_);
    if (order_) {
      e.seq = order_->next_seq_locked();
      e.flags = trace::kFlagSequenced;
    }
    recorder_.record(e);
  }

 private:
  trace::TraceRecorder& recorder_;
  const int device_;
  trace::TraceOrderedResource* order_ = nullptr;
};

static_assert(static_cast<int>(SegmentObserver::Reuse::kFenceDone) == static_cast<int>(trace::ReuseMoment::kFenceDone) &&
              static_cast<int>(SegmentObserver::Reuse::kFenceWaited) == static_cast<int>(trace::ReuseMoment::kFenceWaited) &&
              static_cast<int>(SegmentObserver::Reuse::kEventDone) == static_cast<int>(trace::ReuseMoment::kEventDone) &&
              static_cast<int>(SegmentObserver::Reuse::kSync) == static_cast<int>(trace::ReuseMoment::kSync),
              "the trace stores SegmentObserver::Reuse as trace::ReuseMoment");

}  // namespace

void Shim::start_trace() {
  const std::string path = expand_path_template(config_.trace_template, file_name_of(exe_), pid_, ".trace");
  std::string created;
  const int fd = create_new_file(path, &created);
  if (fd < 0) {
    log_line("no trace is recorded (GPUSHIM_TRACE)");
    return;
  }
  trace::HeaderInfo h;
  h.pid = pid_;
  h.exe = exe_;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) h.host = host;
  if (const char* rank = getenv("RANK")) h.rank = rank;
  h.policy = policy_name(config_.policy);
  h.start_mono_ns = start_ns_;
  h.start_wall_ns = wall_ns() - (now_ns() - start_ns_);
  h.stack_depth = config_.stack_depth;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "GPUSHIM_", 8) == 0) h.config.emplace_back(*e);
  trace_owner_ = trace::TraceRecorder::start(fd, created, h, &stacks_);
  trace_ = trace_owner_.get();
  // Python frame words mean nothing outside this process: the writer thread resolves each one
  // once, from the locations the capturer copied at allocation time (no interpreter access, so no
  // GIL), and writes it before the first stack that uses it, as the report does at exit.
  if (trace_)
    trace_->set_python_resolver([this](uint32_t id, FrameInfo* f) { return capturer_.resolve_python(id, f); });
}

void Shim::trace_alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream,
                       bool stream_ordered) {
  TraceEvent e;
  // After the memory was obtained, so after the free (timed before the memory was released) of
  // any earlier holder of the address. Pool operations also carry their number in the pool's order.
  e.t_ns = rec.time_ns;
  e.addr = ptr;
  e.size = rec.size;
  // What the policy was asked for, so a replay asks the same: for cudaMallocPitch that is the
  // pitched size (pitch x height, all of it addressable), not width x height.
  e.requested = request;
  e.stream = reinterpret_cast<uint64_t>(stream);
  e.stack = rec.stack;
  e.device = rec.device;
  e.kind = EventKind::kAlloc;
  e.flags = event_flags(rec, stream_ordered);
  if (request != rec.requested) e.flags |= trace::kFlagPitched;
  if (rec.route == Route::kPooled) {
    e.seq = trace::TraceOrderedResource::last_op_seq();
    e.flags |= trace::kFlagSequenced;
  }
  trace_->record(e);
}

void Shim::trace_free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream,
                      bool stream_ordered) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.addr = ptr;
  e.size = rec.size;
  e.requested = rec.requested;
  e.stream = reinterpret_cast<uint64_t>(stream);
  e.stack = rec.stack;
  e.device = rec.device;
  e.kind = EventKind::kFree;
  e.flags = event_flags(rec, stream_ordered);
  if (rec.route == Route::kPooled) {
    e.seq = trace::TraceOrderedResource::last_op_seq();
    e.flags |= trace::kFlagSequenced;
  }
  trace_->record(e);
}

void Shim::trace_oom(const OomRecord& oom) {
  TraceEvent e;
  e.t_ns = oom.t_ns + start_ns_;
  e.size = oom.device_free;
  e.requested = oom.requested;
  e.stack = oom.stack;
  e.device = static_cast<int16_t>(oom.device);
  e.kind = EventKind::kOom;
  trace_->record(e);
}

void Shim::trace_device(DeviceState* d) {
  trace_->add_device(trace::DeviceInfo{d->ordinal, d->capacity, d->ledger.budget().limit()});
}

std::unique_ptr<DeviceMemoryResource> Shim::make_traced_pool(DeviceState* d, Backend& capped) {
  auto tracer = std::make_unique<SegmentTracer>(*trace_, d->ordinal);
  SegmentTracer* segments = tracer.get();
  d->segment_tracer = std::move(tracer);
  d->observed = std::make_unique<ObservedBackend>(capped, *d->segment_tracer);
  std::unique_ptr<DeviceMemoryResource> pool = make_pool(config_, *d->observed);
  if (pool == nullptr) return nullptr;
  auto ordered = std::make_unique<trace::TraceOrderedResource>(std::move(pool));
  segments->set_order(ordered.get());
  return ordered;
}

uint64_t Shim::on_iteration_mark() {
  const uint64_t n = iterations_.add(IterationCounter::kMark);
  if (iteration_checkpoints_.due(n)) sample_sites(now_ns() - start_ns_);
  if (trace_) {
    TraceEvent e;
    e.t_ns = now_ns();
    e.size = n;
    e.kind = EventKind::kIteration;
    trace_->record(e);
  }
  return n;
}

void Shim::finish_trace() {
  if (forked_child_) return;
  trace::EndInfo end;
  end.end_mono_ns = now_ns();
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
    end.devices.push_back(t);
  }
  trace_->finish(std::move(end));
}

// ---- growth checkpoints ----
// Per-site totals at checkpoints (logical time and the time series' instants), each recorded in the
// trace so that gpushim-analyze replays exactly the checkpoints the report judged.

void Shim::sample_sites(uint64_t t_ns) {
  // Teardown frees what the program held: its drop must not read as the end of a leak.
  if (teardown_.load(std::memory_order_acquire) != nullptr) return;
  const uint64_t iteration = iterations_.count();
  // A checkpoint goes into the trace only if the history kept it: the trace replays exactly these.
  if (site_history_.sample(t_ns, iteration, sites()) && trace_) {
    trace::TraceEvent e;
    e.t_ns = t_ns + start_ns_;
    e.size = iteration;
    e.requested = iterations_.sources();
    e.kind = trace::EventKind::kCheckpoint;
    trace_->record(e);
  }
}

}  // namespace gpushim
