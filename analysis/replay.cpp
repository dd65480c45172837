#include "replay.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "cli.h"
#include "memory_levels.h"
#include "policy/device_budget.h"
#include "policy/limited_backend.h"
#include "policy/policy_factory.h"
#include "pytorch_policy.h"

namespace gpushim::analysis {
namespace {

// "No device limit" for the simulation, where the trace does not know the device's size: above any
// GPU made, and small enough that a request as large fails at once rather than mapping pages one by
// one: at 1 PiB a recorded 512 TiB OOM took pytorch-expandable 58 s and 5 GiB to replay (26 million
// 20 MiB pages mapped; an adversarial helper's trace).
constexpr uint64_t kUnknownCapacity = 16ull << 40;  // 16 TiB

struct Block {
  void* ptr = nullptr;  // null: the allocation failed in the replay; its free is skipped
  uint64_t size = 0;
  uint64_t requested = 0;
  bool forwarded = false;
};

// One simulated device: SimBackend <- LimitedBackend (the cap) <- pool, as in the shim.
struct SimDevice {
  SimDevice(const ReplaySettings& settings, uint64_t capacity, uint64_t limit) : sim(capacity), limited(sim, budget) {
    budget.set_limit(limit);
    if (settings.model == ReplayModel::kShim) pool = make_pool(settings.config, limited);
    else pool = std::make_unique<PyTorchCachingAllocator>(limited, settings.model == ReplayModel::kPyTorchExpandable);
  }
  ~SimDevice() { pool.reset(); }  // before the backends it uses

  SimBackend sim;
  DeviceBudget budget;
  LimitedBackend limited;
  std::unique_ptr<DeviceMemoryResource> pool;
  absl::flat_hash_map<uint64_t, Block> blocks;  // recorded address -> replayed block
  uint64_t allocated = 0, forwarded = 0, requested = 0, graph = 0;
  CUstream first_ordered_stream = nullptr;
  bool saw_ordered_free = false;
  uintptr_t next_forwarded_addr = 0x200000000000ull;
  ReplayDevice result;
  SimCounters before_steady;  // the driver calls made when the second iteration mark came
  bool steady = false;
  uint64_t script_fences = 0, script_events = 0;  // the highest numbers the run's reuse moments name
  // When the replay, following the run, first did something the run did not (0: never): the
  // completion samples after it describe another sequence of fences than the run's.
  uint64_t departed_ns = 0;
  uint64_t verify_fences = 0, verify_events = 0;  // named by reuse moments of the operation under way
  // Streams the run's pool forgot in one call (kStreamRetired), gathered until all have come: one
  // call records their events in the order the run's did.
  std::vector<CUstream> retiring;
  uint64_t retiring_together = 0;
  void retire_streams() {
    if (retiring.empty()) return;
    if (pool) pool->forget_streams([this](CUstream s) { return std::find(retiring.begin(), retiring.end(), s) != retiring.end(); });
    retiring.clear();
  }
  void verify_script(uint64_t t_ns) {
    if (departed_ns == 0 && (verify_fences > sim.fence_calls() || verify_events > sim.event_calls()))
      departed_ns = std::max<uint64_t>(t_ns, 1);
    verify_fences = verify_events = 0;
  }
};

}  // namespace

std::map<int, uint64_t> recorded_peak_allocated(const TraceData& trace) {
  MemoryLevels levels;
  std::map<int, uint64_t> peaks;
  for (const TraceEvent& e : trace.events)
    if (const MemoryLevels::Device* d = levels.apply(e)) peaks[e.device] = std::max(peaks[e.device], d->allocated);
  return peaks;
}

bool parse_policy_name(const std::string& name, PolicyKind* out) {
  const ConfigResult r = parse_config(std::vector<std::pair<std::string, std::string>>{{"GPUSHIM_POLICY", name}});
  if (!r.ok()) return false;
  *out = r.config.policy;
  return true;
}

const std::vector<std::pair<std::string, ReplayModel>>& replay_baselines() {
  static const std::vector<std::pair<std::string, ReplayModel>> kBaselines{
      {"pytorch", ReplayModel::kPyTorch}, {"pytorch-expandable", ReplayModel::kPyTorchExpandable}};
  return kBaselines;
}

std::vector<PolicyKind> available_policies() {
  std::vector<PolicyKind> out;
  for (const char* name : {"passthrough", "caching", "vmm"}) {
    PolicyKind p;
    if (!parse_policy_name(name, &p)) continue;
    if (p != PolicyKind::kPassthrough) {
      // A policy the configuration accepts but the factory cannot build yet is not offered.
      Config c;
      c.policy = p;
      SimBackend sim(kUnknownCapacity);
      if (make_pool(c, sim) == nullptr) continue;
    }
    out.push_back(p);
  }
  return out;
}

bool recorded_config(const TraceData& trace, const std::vector<std::string>& overrides, Config* out,
                     std::vector<std::string>* notes, std::string* error) {
  // Entries that do not shape the pools (files, output) are left out: a replay writes nothing.
  auto relevant = [](const std::string& name) {
    return name != "GPUSHIM_REPORT" && name != "GPUSHIM_TRACE" && name != "GPUSHIM_SUMMARY";
  };
  std::vector<std::pair<std::string, std::string>> vars;
  for (const std::string& c : trace.header.config) {
    const size_t eq = c.find('=');
    if (eq == std::string::npos || !relevant(c.substr(0, eq))) continue;
    std::vector<std::pair<std::string, std::string>> one{{c.substr(0, eq), c.substr(eq + 1)}};
    if (!parse_config(one).ok()) {
      notes->push_back("recorded setting " + c + " is not understood by this build; ignored");
      continue;
    }
    vars.push_back(one[0]);
  }
  // A vmm trace that does not name GPUSHIM_VMM_REUSE was recorded before it existed (the recorder
  // names it since), by the pool that built from idle memory only: that is the pool it replays as.
  if (trace.header.policy == policy_name(PolicyKind::kVmm) &&
      std::none_of(vars.begin(), vars.end(), [](const auto& v) { return v.first == "GPUSHIM_VMM_REUSE"; })) {
    vars.emplace_back("GPUSHIM_VMM_REUSE", "idle");
    notes->push_back("recorded before GPUSHIM_VMM_REUSE existed: its vmm replays as the pool that ran "
                     "(GPUSHIM_VMM_REUSE=idle); --set GPUSHIM_VMM_REUSE=stream-order replays today's");
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      *error = "--set expects NAME=value, got '" + o + "'";
      return false;
    }
    // parse_config passes over a name without the GPUSHIM_ prefix (and the tools' own GPUSHIM_*
    // variables), as an environment holds other variables: given here, ROUND=1MiB replayed with
    // the recorded rounding and no word. The names are config --check's (one table).
    if (const std::string why = setting_name_problem(o.substr(0, eq)); !why.empty()) {
      *error = "--set " + o + ": " + why;
      return false;
    }
    std::vector<std::pair<std::string, std::string>> one{{o.substr(0, eq), o.substr(eq + 1)}};
    const ConfigResult r = parse_config(one);
    if (!r.ok()) {
      *error = r.errors.front().message();
      return false;
    }
    // The cap and the policies are the replay's own options, which decide them: given here they
    // were accepted and changed nothing (--set GPUSHIM_LIMIT=1MiB replayed without a cap).
    if (one[0].first == "GPUSHIM_LIMIT" || one[0].first == "GPUSHIM_POLICY") {
      const bool cap = one[0].first == "GPUSHIM_LIMIT";
      *error = "--set " + o + ": a replay's " + (cap ? "cap is --limit's" : "policies are --policy's") + " (" +
               (cap ? "--limit " : "--policy ") + one[0].second + ")";
      return false;
    }
    vars.push_back(one[0]);
  }
  const ConfigResult r = parse_config(vars);
  if (!r.ok()) {
    *error = r.errors.front().message();
    return false;
  }
  *out = r.config;
  PolicyKind recorded;
  if (parse_policy_name(trace.header.policy, &recorded)) out->policy = recorded;
  return true;
}

ReplayResult replay_trace(const TraceData& trace, const ReplaySettings& settings) {
  ReplayResult result;
  result.policy = policy_name(settings.config.policy);
  for (const auto& [name, model] : replay_baselines())
    if (model == settings.model) result.policy = name;
  if (settings.model == ReplayModel::kShim && settings.config.policy != PolicyKind::kPassthrough) {
    SimBackend probe(kUnknownCapacity);
    if (make_pool(settings.config, probe) == nullptr) {
      result.available = false;
      return result;
    }
  }
  // Memory the recording forwarded under a pooling policy belongs to CUDA under every policy
  // (graph-capture memory, arrays, the driver API's). Under a recorded passthrough, everything was
  // forwarded by policy; what a handle keys (trace::keyed_by_handle) is CUDA's all the same.
  PolicyKind recorded_policy = PolicyKind::kCaching;
  const bool recorded_passthrough =
      parse_policy_name(trace.header.policy, &recorded_policy) && recorded_policy == PolicyKind::kPassthrough;

  // The run's reuse moments, and where its segments and address ranges lay, are followed only
  // where the replay is the run: its policy, cap, device and settings. A device whose trace has no
  // reuse moments (an older trace) keeps the simulation's timing.
  std::set<int> devices_with_reuse;
  const bool follow = settings.gpu_time == GpuTime::kRecorded && settings.follow_recorded_reuse && !settings.stream_ordered && settings.model == ReplayModel::kShim &&
                      !settings.limit_given && settings.capacity == 0 &&
                      parse_policy_name(trace.header.policy, &recorded_policy) && recorded_policy == settings.config.policy;
  if (follow)
    for (const TraceEvent& e : trace.events)
      if (e.kind == EventKind::kReuse) devices_with_reuse.insert(e.device);

  std::shared_ptr<const std::map<int, DeviceLag>> lags = settings.lags;
  if (settings.gpu_time == GpuTime::kModel && (lags == nullptr || lags->empty())) {
    Config recorded_config = settings.config;
    if (parse_policy_name(trace.header.policy, &recorded_policy)) recorded_config.policy = recorded_policy;
    lags = std::make_shared<const std::map<int, DeviceLag>>(estimate_device_lag(trace, recorded_config));
  }
  result.gpu_time = settings.gpu_time;

  std::map<int, std::unique_ptr<SimDevice>> devices;
  auto device = [&](int ordinal) -> SimDevice& {
    auto it = devices.find(ordinal);
    if (it != devices.end()) return *it->second;
    const trace::DeviceInfo* info = trace.device(ordinal);
    uint64_t capacity = settings.capacity ? settings.capacity : info && info->capacity ? info->capacity : kUnknownCapacity;
    const uint64_t limit = settings.limit_given ? settings.limit.resolve(capacity) : info ? info->limit : 0;
    auto d = std::make_unique<SimDevice>(settings, capacity, limit);
    d->result.device = ordinal;
    d->result.capacity = capacity;
    d->result.limit = limit;
    if (settings.gpu_time == GpuTime::kModel) {
      auto l = lags->find(ordinal);
      const DeviceLag& lag = l != lags->end() ? l->second : lags->begin()->second;
      d->sim.model_completion([&lag](uint64_t r) { return lag.completes_at(r); });
      d->result.backlog_ns = lag.backlog_ns();
      d->result.backlog_source = lag.source();
    } else if (devices_with_reuse.count(ordinal)) {
      d->sim.follow_script();
      d->result.follows_recorded_reuse = true;
    }
    return *devices.emplace(ordinal, std::move(d)).first->second;
  };

  const auto start = std::chrono::steady_clock::now();
  uint64_t marks = 0;
  for (uint64_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    for (auto& [ord, dv] : devices) dv->sim.set_clock(e.t_ns);
    if (e.kind == EventKind::kIteration && ++marks == 2) {
      // Marks are the process's, not a device's: the steady state begins for every device.
      for (auto& [ord, d] : devices) d->before_steady = d->sim.counters(), d->steady = true;
      continue;
    }
    if (e.kind == EventKind::kReuse) {
      if (!devices_with_reuse.count(e.device)) continue;
      SimDevice& d = device(e.device);
      const auto what = static_cast<trace::ReuseMoment>(e.requested);
      // The run had recorded the fence or event it names by the end of the pool operation this
      // moment belongs to (it comes first in the trace): checked after that operation.
      if (what == trace::ReuseMoment::kFenceDone || what == trace::ReuseMoment::kFenceWaited)
        d.verify_fences = std::max(d.verify_fences, e.size);
      else if (what == trace::ReuseMoment::kEventDone)
        d.verify_events = std::max(d.verify_events, e.size);
      if (what == trace::ReuseMoment::kFenceDone || what == trace::ReuseMoment::kFenceWaited) {
        d.sim.script_completion(true, e.size, e.addr);
        d.script_fences = std::max(d.script_fences, e.size);
      } else if (what == trace::ReuseMoment::kEventDone) {
        d.sim.script_completion(false, e.size, e.addr);
        d.script_events = std::max(d.script_events, e.size);
      }
      // kSync: the replay's pool synchronizes at the same point by itself, which completes all.
      continue;
    }
    if (e.kind == EventKind::kStreamRetired) {
      // The program ended streams on which the pool held free blocks: whatever the policy, a block
      // must not stay tied to a handle that a later stream may be given.
      SimDevice& d = device(e.device);
      d.retiring.push_back(reinterpret_cast<CUstream>(e.stream));
      d.retiring_together = e.size;
      if (d.retiring.size() >= d.retiring_together) d.retire_streams();
      continue;
    }
    if (e.kind == EventKind::kSegmentAlloc || e.kind == EventKind::kVaReserve) {
      // It comes first in the trace, inside the pool operation that took it (the next of its
      // device's operations here): that operation's segment or range goes where the run's went.
      if (follow && e.kind == EventKind::kSegmentAlloc) device(e.device).sim.place_next_segment(e.addr, e.size);
      if (follow && e.kind == EventKind::kVaReserve) device(e.device).sim.place_next_reservation(e.addr, e.size);
      continue;
    }
    const bool refused = e.kind == EventKind::kOom;
    if (e.kind != EventKind::kAlloc && e.kind != EventKind::kFree && !refused) continue;
    const uint8_t kind = e.flags & trace::kFlagKindMask;
    if (kind == static_cast<uint8_t>(MemoryKind::kGraph) && !refused) {
      // Graph memory belongs to CUDA under every policy, but the shim charges it to the cap: so
      // does the replay, or a capped run with graphs would fit better in the replay than it did.
      SimDevice& d = device(e.device);
      if (e.kind == EventKind::kAlloc) {
        d.budget.charge(e.size);
        d.graph += e.size;
        d.result.graph_bytes_peak = std::max(d.result.graph_bytes_peak, d.graph);
      } else if (d.graph >= e.size) {
        d.budget.uncharge(e.size);
        d.graph -= e.size;
      }
      continue;
    }
    if (kind != static_cast<uint8_t>(MemoryKind::kDevice)) continue;
    SimDevice& d = device(e.device);
    d.retire_streams();  // a group cut short (a damaged or dropped tail of the run's call)
    ++result.events;
    const bool ordered = settings.stream_ordered || (e.flags & trace::kFlagStreamOrdered) != 0;
    const CUstream stream = reinterpret_cast<CUstream>(e.stream);
    if (e.kind == EventKind::kAlloc || refused) {
      if (refused) {
        ++d.result.recorded_ooms;
        if (e.size != 0 && e.size < e.requested) ++d.result.oom_device_short;
      }
      Block b;
      const bool forward = d.pool == nullptr || trace::keyed_by_handle(e.addr) ||
                           (!recorded_passthrough && (e.flags & trace::kFlagForwarded) != 0);
      CUresult r = CUDA_SUCCESS;
      if (forward) {
        // CUDA serves it; the cap and the device size still apply, as in the shim.
        b.forwarded = true;
        b.size = e.requested;
        const bool fits = d.sim.used() + d.forwarded + b.size <= d.sim.capacity();
        if (!fits || !d.budget.try_charge(b.size)) {
          r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
          d.budget.commit(b.size);
          b.ptr = reinterpret_cast<void*>(d.next_forwarded_addr);
          d.next_forwarded_addr += (b.size + 511) / 512 * 512 + 512;
          d.forwarded += b.size;
          ++d.result.forwarded_calls;
        }
      } else {
        uint64_t allocated = 0;
        r = d.pool->allocate(AllocRequest{e.requested, stream, ordered}, &b.ptr, &allocated);
        d.sim.forget_placements();  // the run's segments or ranges of this operation that the replay did not take
        b.size = allocated;
        if (r == CUDA_SUCCESS && !refused && d.result.follows_recorded_reuse && allocated != e.size &&
            d.result.first_difference_event == 0) {
          d.result.first_difference_event = i + 1;
          if (d.departed_ns == 0) d.departed_ns = std::max<uint64_t>(e.t_ns, 1);
          d.result.difference = "the replay handed out " + std::to_string(allocated) + " bytes where the run handed out " +
                                std::to_string(e.size) + " (the pool's free blocks differ)";
        }
      }
      if (r != CUDA_SUCCESS) {
        b.ptr = nullptr;
        if (!refused && d.result.first_difference_event == 0) d.result.first_difference_event = i + 1;
        if (d.result.ooms++ == 0) {
          d.result.oom_event = i + 1;
          d.result.oom_t_ns = e.t_ns;
          d.result.oom_requested = e.requested;
          d.result.oom_allocated = d.allocated;
          d.result.oom_reserved = d.sim.used() + d.forwarded;
          d.result.oom_stack = e.stack;
        }
      } else {
        ++d.result.allocs;
        d.allocated += b.size;
        d.result.peak_allocated = std::max(d.result.peak_allocated, d.allocated);
        b.requested = e.requested;
        d.requested += b.requested;
        d.result.peak_requested = std::max(d.result.peak_requested, d.requested);
      }
      if (refused) {
        // The recorded program never got this memory: give it back at once if the replay did.
        if (b.ptr != nullptr) {
          ++d.result.recorded_ooms_avoided;
          if (d.result.first_difference_event == 0) d.result.first_difference_event = i + 1;
          d.result.peak_reserved = std::max(d.result.peak_reserved, d.sim.used() + d.forwarded);
          --d.result.allocs;
          d.allocated -= b.size;
          d.requested -= b.requested;
          if (b.forwarded) d.forwarded -= b.size, d.budget.uncharge(b.size);
          else d.pool->deallocate(b.ptr, stream, false);
        }
        continue;
      }
      d.blocks[e.addr] = b;
    } else {
      auto it = d.blocks.find(e.addr);
      if (it == d.blocks.end()) continue;
      const Block b = it->second;
      d.blocks.erase(it);
      if (b.ptr == nullptr) continue;  // its allocation failed in the replay
      if (ordered) {
        if (!d.saw_ordered_free) d.saw_ordered_free = true, d.first_ordered_stream = stream;
        else if (stream != d.first_ordered_stream) ++d.result.cross_stream_reuse_frees;
      }
      ++d.result.frees;
      d.allocated -= b.size;
      d.requested -= b.requested;
      if (b.forwarded) {
        d.forwarded -= b.size;
        d.budget.uncharge(b.size);
        ++d.result.forwarded_calls;
      } else {
        d.pool->deallocate(b.ptr, stream, ordered);
        d.sim.forget_placements();
      }
    }
    d.result.peak_reserved = std::max(d.result.peak_reserved, d.sim.used() + d.forwarded + d.graph);
    if (d.result.follows_recorded_reuse) d.verify_script(e.t_ns);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  for (auto& [ord, d] : devices) {
    if (d->result.follows_recorded_reuse && d->result.difference.empty() &&
        (d->script_fences > d->sim.fence_calls() || d->script_events > d->sim.event_calls()))
      d->result.difference = "the run recorded " + std::to_string(d->script_fences) + " fences and " +
                             std::to_string(d->script_events) + " events, the replay " +
                             std::to_string(d->sim.fence_calls()) + " and " + std::to_string(d->sim.event_calls());
    d->result.end_allocated = d->allocated;
    if (d->result.follows_recorded_reuse) {
      for (const auto& c : d->sim.completion_samples())
        if (d->departed_ns == 0 || std::max({c.recorded_ns, c.pending_ns, c.done_ns}) < d->departed_ns)
          d->result.completion_samples.push_back(c);
      d->result.completion_departed_ns = d->departed_ns;
    }
    d->result.driver = d->sim.counters();
    if (marks >= 2) {
      const SimCounters& before = d->before_steady;  // zeros for a device first seen after the mark
      d->result.steady_synchronizes = static_cast<int64_t>(d->result.driver.synchronizes - before.synchronizes);
      d->result.steady_maps = static_cast<int64_t>(d->result.driver.maps - before.maps);
      d->result.steady_unmaps = static_cast<int64_t>(d->result.driver.unmaps - before.unmaps);
    }
    result.devices.push_back(d->result);
  }
  return result;
}

std::map<int, DeviceLag> estimate_device_lag(const TraceData& trace, const Config& recorded) {
  // The fallback: a fraction of the median step, else a fixed backlog.
  std::vector<uint64_t> marks, steps;
  for (const TraceEvent& e : trace.events)
    if (e.kind == EventKind::kIteration) marks.push_back(e.t_ns);
  for (size_t i = 1; i < marks.size(); ++i) steps.push_back(marks[i] - marks[i - 1]);
  DeviceLag fallback;
  char buf[200];
  if (!steps.empty()) {
    std::nth_element(steps.begin(), steps.begin() + steps.size() / 2, steps.end());
    const uint64_t step = steps[steps.size() / 2];
    const auto backlog = static_cast<uint64_t>(kTypicalBacklogStepFraction * static_cast<double>(step));
    std::snprintf(buf, sizeof(buf), "typical: %.0f%% of the median step (%.2f ms), %.2f ms (the trace records no reuse moments)",
                  100 * kTypicalBacklogStepFraction, static_cast<double>(step) / 1e6, static_cast<double>(backlog) / 1e6);
    fallback = DeviceLag::fixed(backlog, buf);
  } else {
    std::snprintf(buf, sizeof(buf), "typical: %.2f ms (the trace records no reuse moments and no steps)",
                  static_cast<double>(kTypicalBacklogNs) / 1e6);
    fallback = DeviceLag::fixed(kTypicalBacklogNs, buf);
  }
  std::map<int, DeviceLag> out;
  bool has_reuse = false;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == EventKind::kReuse) has_reuse = true;
    if (e.kind == EventKind::kAlloc || e.kind == EventKind::kFree || e.kind == EventKind::kOom) out.emplace(e.device, fallback);
  }
  if (out.empty()) out.emplace(0, fallback);
  if (!has_reuse) return out;
  ReplaySettings calibrate;
  calibrate.config = recorded;
  calibrate.gpu_time = GpuTime::kRecorded;
  const ReplayResult r = replay_trace(trace, calibrate);
  for (const ReplayDevice& d : r.devices) {
    if (!d.follows_recorded_reuse) continue;
    DeviceLag lag = DeviceLag::estimate(d.completion_samples, fallback);
    if (d.completion_departed_ns != 0) {
      // The pools are not the code that recorded the trace (or the trace cannot pin them down):
      // only what the calibration saw before it departed from the run is the run's device.
      std::snprintf(buf, sizeof(buf), "; the calibration replay departed from the run at %.3f s (this build's pool is "
                    "not the recording's, or the trace does not pin it down): only the samples before it were used",
                    trace.seconds(d.completion_departed_ns));
      lag.append_source(buf);
    }
    out[d.device] = std::move(lag);
  }
  return out;
}

}  // namespace gpushim::analysis
