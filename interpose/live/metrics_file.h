// The GPUSHIM_METRICS file: rendered as Prometheus text and replaced atomically on every update.
#pragma once

#include <sys/types.h>

#include <string>

#include "live/process_metrics.h"

namespace gpushim {

class MetricsFile {
 public:
  explicit MetricsFile(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // Writes the figures; returns false on failure. A failure is told on stderr when it starts (and
  // when its cause changes), not at every update: a full disk must not flood the program's stderr.
  // The one rule of every file the shim writes: only a regular file that gpushim created is ever
  // replaced. Anything else at the path (a file of someone else's, a FIFO, a directory, a symlink)
  // gets one line and is never written; /dev/stdout, /dev/stderr and other character devices are
  // written to as they are.
  bool write(const ProcessMetrics& m);

 private:
  // True if what sits at the path now may be replaced: nothing, the file this object last put
  // there, or a metrics file an earlier gpushim process wrote (a restarted job). Otherwise says
  // why not in *what.
  bool replaceable(const char** what);
  bool write_in_place(const std::string& text);  // a character device or a standard stream

  std::string path_;
  int failing_with_ = 0;   // errno of the current run of failures, 0 when the last write worked
  unsigned notices_ = 0;   // failure lines printed so far
  bool refused_ = false;   // the path holds something not ours: never written
  dev_t dev_ = 0;          // the file we last put at the path
  ino_t ino_ = 0;
};

}  // namespace gpushim
