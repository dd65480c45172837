// Renders ProcessMetrics in the Prometheus text exposition format (version 0.0.4), the format
// node_exporter's textfile collector reads from *.prom files.
#pragma once

#include <string>

#include "live/process_metrics.h"

namespace gpushim {

// Every family has HELP and TYPE lines and all its samples together; names start with gpushim_,
// counters end in _total, byte gauges in _bytes. Series carry host, pid and rank (and device), so
// files of many processes and nodes merge without collisions. No timestamps: node_exporter
// rejects them. A family with no samples (unaccounted while unknown) is left out entirely.
std::string to_prometheus_text(const ProcessMetrics& m);

}  // namespace gpushim
