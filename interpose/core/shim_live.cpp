// The Shim's side of the live outputs (live/): the figures they show and when they start and end.
#include "core/shim.h"

namespace gpushim {

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

}  // namespace gpushim
