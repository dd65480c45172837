// The gpushim_* C API (public/gpushim.h).
#include "public/gpushim.h"

#include <cstring>

#include "core/shim.h"

#include "hooks/export.h"

GPUSHIM_EXPORT int gpushim_get_device_stats(int device, struct gpushim_device_stats* out) {
  if (out == nullptr || out->struct_size < sizeof(struct gpushim_device_stats)) return -1;
  gpushim::Shim* s = gpushim::Shim::existing();
  if (s == nullptr) return -1;
  const gpushim::DeviceState* d = s->existing_device(device);
  if (d == nullptr) return -1;
  const gpushim::CounterSnapshot c = d->ledger.counters().snapshot();
  const gpushim::PoolFigures f = s->pool_figures(d);
  out->live_bytes = c.live_bytes;
  out->live_count = c.live_count;
  out->requested_bytes = c.requested_bytes;
  out->reserved_bytes = f.reserved_bytes;
  out->peak_allocated_bytes = c.peak_bytes;
  out->peak_reserved_bytes = f.peak_reserved_bytes;
  out->total_allocs = c.total_allocs;
  out->total_frees = c.total_frees;
  out->failed_allocs = c.failed_allocs;
  out->reuse_syncs = f.reuse_syncs;
  out->ooms = f.ooms;
  out->limit_bytes = d->ledger.budget().limit();
  return 0;
}

GPUSHIM_EXPORT unsigned long long gpushim_mark_iteration(void) {
  gpushim::Shim* s = gpushim::Shim::existing();
  return s ? s->mark_iteration() : 0;
}

GPUSHIM_EXPORT unsigned long long gpushim_host_bytes(void) {
  const gpushim::Shim* s = gpushim::Shim::existing();
  return s == nullptr ? 0 : s->host_bytes();
}
