#include "recorder/trace_tap.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "policy/observed_backend.h"
#include "policy/policy_factory.h"
#include "report/output_file.h"
#include "recorder/trace_ordered_resource.h"
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
  void on_segment(Change change, uintptr_t addr, uint64_t bytes, bool shared) override {
    TraceEvent e;
    e.t_ns = now_ns();
    e.addr = addr;
    e.size = bytes;
    stamp(&e);
    if (shared) e.flags |= trace::kFlagSharedMapping;
    switch (change) {
      case Change::kAlloc: e.kind = EventKind::kSegmentAlloc; break;
      case Change::kFree: e.kind = EventKind::kSegmentFree; break;
      case Change::kMap: e.kind = EventKind::kSegmentMap; break;
      case Change::kUnmap: e.kind = EventKind::kSegmentUnmap; break;
      case Change::kReserve: e.kind = EventKind::kVaReserve; break;
      case Change::kRelease: e.kind = EventKind::kVaFree; break;
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
    stamp(&e);
    recorder_.record(e);
  }
  // Called by the ordering wrapper, under its lock, for each stream one forget_streams retired.
  void on_stream_retired(CUstream stream, size_t together) {
    TraceEvent e;
    e.t_ns = now_ns();
    e.kind = EventKind::kStreamRetired;
    e.stream = reinterpret_cast<uint64_t>(stream);
    e.size = together;
    stamp(&e);
    recorder_.record(e);
  }

 private:
  // The device, and the pool's sequence number: the pool holds its lock while it calls in.
  void stamp(TraceEvent* e) {
    e->device = static_cast<int16_t>(device_);
    if (order_) {
      e->seq = order_->next_seq_locked();
      e->flags = trace::kFlagSequenced;
    }
  }

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

std::unique_ptr<TraceTap> TraceTap::start(const Config& config, const std::string& exe, int pid, uint64_t start_ns,
                                           const StackTable* stacks, Symbolizer::PythonResolver python) {
  const std::string path = expand_path_template(config.trace_template, file_name_of(exe), pid, ".trace");
  std::string created;
  const int fd = create_new_file(path, &created, where_allowed(config.trace_template));
  if (fd < 0) return nullptr;  // create_new_file said why, in one line
  trace::HeaderInfo h;
  h.pid = pid;
  h.exe = exe;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) h.host = host;
  if (const char* rank = getenv("RANK")) h.rank = rank;
  h.policy = policy_name(config.policy);
  h.start_mono_ns = start_ns;
  h.start_wall_ns = wall_ns() - (now_ns() - start_ns);
  h.stack_depth = config.stack_depth;
  bool reuse_named = false;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "GPUSHIM_", 8) == 0) {
      h.config.emplace_back(*e);
      reuse_named |= std::strncmp(*e, "GPUSHIM_VMM_REUSE=", 18) == 0;
    }
  // Settings whose default changed name the pool that ran, set or not: a replay under the recorded
  // policy rebuilds that pool, and takes a trace without them for one recorded before they existed.
  if (config.policy == PolicyKind::kVmm && !reuse_named)
    h.config.emplace_back(config.vmm_stream_order_builds ? "GPUSHIM_VMM_REUSE=stream-order" : "GPUSHIM_VMM_REUSE=idle");
  std::unique_ptr<trace::TraceRecorder> recorder = trace::TraceRecorder::start(fd, created, h, stacks);
  if (recorder == nullptr) return nullptr;
  // Python frame words mean nothing outside this process: the writer thread resolves each one
  // once, from the locations the capturer copied at allocation time (no interpreter access, so no
  // GIL), and writes it before the first stack that uses it, as the report does at exit.
  recorder->set_python_resolver(std::move(python));
  return std::unique_ptr<TraceTap>(new TraceTap(std::move(recorder), start_ns));
}

void TraceTap::alloc(uintptr_t ptr, const AllocationRecord& rec, uint64_t request, CUstream stream,
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
  recorder_->record(e);
}

void TraceTap::free(uint64_t t_ns, uintptr_t ptr, const AllocationRecord& rec, CUstream stream,
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
  recorder_->record(e);
}

void TraceTap::oom(const OomRecord& oom) {
  TraceEvent e;
  e.t_ns = oom.t_ns + start_ns_;
  e.size = oom.device_free;
  e.requested = oom.requested;
  e.stack = oom.stack;
  e.device = static_cast<int16_t>(oom.device);
  e.kind = EventKind::kOom;
  recorder_->record(e);
}

void TraceTap::device(int ordinal, uint64_t capacity, uint64_t limit) {
  recorder_->add_device(trace::DeviceInfo{ordinal, capacity, limit});
}

std::unique_ptr<DeviceMemoryResource> TraceTap::traced_pool(const Config& config, int ordinal, Backend& capped) {
  auto tracer = std::make_unique<SegmentTracer>(*recorder_, ordinal);
  SegmentTracer* segments = tracer.get();
  auto observed = std::make_unique<ObservedBackend>(capped, *segments);
  Backend& upstream = *observed;
  {
    std::lock_guard<std::mutex> lock(pools_mu_);
    tracers_.push_back(std::move(tracer));
    observed_.push_back(std::move(observed));
  }
  std::unique_ptr<DeviceMemoryResource> pool = make_pool(config, upstream);
  if (pool == nullptr) return nullptr;
  auto ordered = std::make_unique<trace::TraceOrderedResource>(std::move(pool));
  segments->set_order(ordered.get());
  ordered->set_retired_observer([segments](CUstream s, size_t together) { segments->on_stream_retired(s, together); });
  return ordered;
}

void TraceTap::iteration(uint64_t n) {
  TraceEvent e;
  e.t_ns = now_ns();
  e.size = n;
  e.kind = EventKind::kIteration;
  recorder_->record(e);
}

void TraceTap::checkpoint(uint64_t t_ns, uint64_t iteration, unsigned sources) {
  TraceEvent e;
  e.t_ns = t_ns + start_ns_;
  e.size = iteration;
  e.requested = sources;
  e.kind = EventKind::kCheckpoint;
  recorder_->record(e);
}

void TraceTap::finish(std::vector<trace::DeviceTotals> devices, uint64_t end_ns, uint64_t teardown_ns) {
  trace::EndInfo end;
  end.end_mono_ns = end_ns;
  end.teardown_mono_ns = teardown_ns ? teardown_ns + start_ns_ : 0;
  end.devices = std::move(devices);
  recorder_->finish(std::move(end));
}

}  // namespace gpushim
