// What gpushim writes while the process runs: the metrics file (GPUSHIM_METRICS) and snapshot
// reports on a signal (GPUSHIM_SNAPSHOT_SIGNAL). Both run on one LiveWorker thread, so nothing
// here adds work to the program's allocating threads, and the signal handler stays trivial.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "live/live_worker.h"
#include "live/metrics_file.h"
#include "live/process_metrics.h"
#include "report/report_model.h"

namespace gpushim {

class LiveOutputs {
 public:
  // Where the figures come from (the RunRecorder, recorder/run_recorder.h).
  struct Sources {
    std::function<std::vector<DeviceMetrics>()> devices;  // current figures; cheap, no symbolization
    std::function<ReportData()> snapshot_report;          // a full report of the current state
  };

  // Starts what `config` asks for; no thread, file or handler when both are off. Called once, at
  // the first CUDA call. `exe` is the executable's path; `start_dir` the working directory then,
  // which relative names are taken from (the program may chdir later).
  void start(const Config& config, const std::string& exe, int pid, const char* policy, const std::string& start_dir,
             Sources sources);

  // Stops the worker, waiting for an update or snapshot in progress, however long it takes: none
  // starts after this. A snapshot requested before (the signal came, the worker had not woken
  // yet) is written now. One exception: called inside the dynamic loader (exit() from a library's
  // constructor during dlopen), this thread holds the loader's lock, which a snapshot may wait for
  // in dladdr until the loader returns, never: then it waits kInLoaderPatienceNs at most, and
  // false says it gave up (the worker still runs; no report may be built beside it).
  bool stop();
  static constexpr uint64_t kInLoaderPatienceNs = 5'000'000'000ull;

  bool metrics_enabled() const { return metrics_file_ != nullptr; }

  // The last update of the metrics file, after stop(): `devices` are the exit report's figures,
  // and gpushim_running is 0.
  void write_final_metrics(std::vector<DeviceMetrics> devices);

  // In a fork child: no worker, and the snapshot signal back as the program had it.
  void abandon_in_fork_child();

 private:
  void refresh_metrics();
  void write_snapshot();
  ProcessMetrics metrics(std::vector<DeviceMetrics> devices, bool running) const;

  ProcessIdentity id_;
  std::string exe_;
  std::string report_template_;   // "" = the default name (also when the exit report is off)
  std::string start_dir_;         // as start() was given it
  double start_time_s_ = 0;
  Sources sources_;
  std::unique_ptr<MetricsFile> metrics_file_;
  uint64_t snapshot_seq_ = 0;                   // worker thread only
  std::atomic<uint64_t> snapshots_written_{0};
  LiveWorker worker_;
};

}  // namespace gpushim
