// The GPUSHIM_METRICS file: rendered as Prometheus text and replaced atomically on every update.
#pragma once

#include <string>

#include "live/process_metrics.h"

namespace gpushim {

class MetricsFile {
 public:
  explicit MetricsFile(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // Writes the figures; returns false on failure. A failure is told on stderr when it starts (and
  // when its cause changes), not at every update: a full disk must not flood the program's stderr.
  bool write(const ProcessMetrics& m);

 private:
  std::string path_;
  int failing_with_ = 0;   // errno of the current run of failures, 0 when the last write worked
  unsigned notices_ = 0;   // failure lines printed so far
};

}  // namespace gpushim
