#include "live/live_outputs.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "live/snapshot_file.h"
#include "live/snapshot_signal.h"
#include "report/output_file.h"
#include "report/report_writer.h"
#include "util/clock.h"
#include "util/loader_frames.h"
#include "util/log.h"
#include "util/paths.h"

namespace gpushim {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

void LiveOutputs::start(const Config& config, const std::string& exe, int pid, const char* policy,
                        const std::string& start_dir, Sources sources) {
  const bool metrics = !config.metrics_template.empty();
  const bool snapshots = config.snapshot_signal != 0;
  if (!metrics && !snapshots) return;

  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) id_.host = host;
  const char* rank = getenv("RANK");  // read once: the worker must not race a later setenv
  id_.rank = rank ? rank : "";
  id_.pid = pid;
  id_.exe_name = std::string(base_name(exe));
  id_.policy = policy;
  exe_ = exe;
  report_template_ = config.report_enabled ? config.report_template : "";
  start_dir_ = start_dir;
  start_time_s_ = static_cast<double>(wall_ns()) / 1e9;
  sources_ = std::move(sources);
  if (metrics) {
    metrics_file_ = std::make_unique<MetricsFile>(
        anchored_at(expand_path_template(config.metrics_template, exe, pid, ".prom"), start_dir_));
    if (!ends_with(metrics_file_->path(), ".prom"))
      log_line("metrics go to %s; node_exporter's textfile collector reads only files named *.prom",
               metrics_file_->path().c_str());
  }

  LiveWorker::Task periodic;
  if (metrics) periodic = [this] { refresh_metrics(); };
  const int err = worker_.start(static_cast<uint64_t>(config.sample_ms) * 1000000ull, std::move(periodic),
                                [this] { write_snapshot(); });
  if (err != 0) {
    log_line("cannot start the gpushim-live thread (%s); the metrics file and snapshots are off", std::strerror(err));
    metrics_file_.reset();
    return;
  }
  if (snapshots) install_snapshot_signal(config.snapshot_signal, worker_.wake_semaphore());
}

bool LiveOutputs::stop() {
  // An idle worker stops at once; a busy one is asked whether this thread is inside the loader
  // (a stack walk: at exit, and only when a task is still running).
  constexpr uint64_t kPromptNs = 200'000'000ull;
  if (!worker_.stop(kPromptNs) && !worker_.stop(called_from_dynamic_loader() ? kInLoaderPatienceNs : 0))
    return false;
  if (sources_.snapshot_report) write_snapshot();  // nothing when no request is pending
  return true;
}

ProcessMetrics LiveOutputs::metrics(std::vector<DeviceMetrics> devices, bool running) const {
  ProcessMetrics m;
  m.id = id_;
  m.start_time_s = start_time_s_;
  m.running = running;
  m.snapshots = snapshots_written_.load(std::memory_order_relaxed);
  m.devices = std::move(devices);
  return m;
}

void LiveOutputs::refresh_metrics() { metrics_file_->write(metrics(sources_.devices(), true)); }

void LiveOutputs::write_final_metrics(std::vector<DeviceMetrics> devices) {
  if (metrics_file_) metrics_file_->write(metrics(std::move(devices), false));
}

void LiveOutputs::write_snapshot() {
  if (take_snapshot_requests() == 0) return;
  const ReportData report = sources_.snapshot_report();
  // Expanded now, like the exit report: %h is this moment's; a relative name is taken from the
  // working directory at the first CUDA call, as the trace's and the metrics file's are.
  const std::string path = anchored_at(
      snapshot_path(expand_path_template(report_template_, exe_, id_.pid), ++snapshot_seq_), start_dir_);
  const std::string written = publish_new_file(path, report_to_json(report), where_allowed(report_template_));
  if (written.empty()) return;  // write_new_file said why
  snapshots_written_.fetch_add(1, std::memory_order_relaxed);
  log_line("snapshot %llu written to %s", static_cast<unsigned long long>(snapshot_seq_), written.c_str());
}

void LiveOutputs::abandon_in_fork_child() {
  worker_.abandon_in_fork_child();
  restore_snapshot_signal();
}

}  // namespace gpushim
