// GPUSHIM_TRACE: records every allocation event of the process into a compact binary file
// (docs/trace-format.md).
//
// The allocating thread only copies a 56-byte event into its own ring (no lock, no system call,
// no allocation after the thread's first event). A background writer thread, started with the
// recorder, drains the rings, writes new modules and stacks before the events that use them, and
// appends delta-coded event chunks. When the disk cannot keep up the rings fill and events are
// dropped and counted (a kDropped marker says where), so memory stays bounded.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "stacks/stack_table.h"
#include "stacks/symbolizer.h"
#include "trace/event_ring.h"
#include "trace/trace_module_table.h"
#include "trace/trace_encoder.h"
#include "trace/trace_event.h"

namespace gpushim::trace {

struct RecorderOptions {
  size_t ring_events = 4096;        // per thread, a power of two: 224 KiB
  unsigned flush_interval_ms = 50;  // the writer also wakes when a ring is half full
};

class TraceRecorder {
 public:
  // Takes ownership of `fd` (a new, empty file), writes the file magic and the header chunk, and
  // starts the writer thread. Returns null, with one log line, if any of that fails.
  static std::unique_ptr<TraceRecorder> start(int fd, std::string path, const HeaderInfo& header,
                                              const StackTable* stacks, RecorderOptions options = {});
  // Only tests and benchmarks destroy a recorder (the shim keeps its own for the whole process):
  // stops the writer thread and closes the file without an end chunk if finish() was not called.
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // Any thread. Lock-free and allocation-free except on a thread's first event.
  void record(const TraceEvent& e);
  // A device the shim started using; written before the next events.
  void add_device(const DeviceInfo& d);
  // Resolves Python frame words of stacks (stacks/stack_table.h) to source locations when set.
  void set_python_resolver(Symbolizer::PythonResolver r) {
    std::lock_guard<std::mutex> lock(registry_mu_);
    python_resolver_ = std::move(r);
  }

  // Writes everything recorded so far, then the end chunk, and closes the file. Events recorded
  // afterwards are ignored. Idempotent; does nothing in a forked child.
  void finish(EndInfo end);
  // Writes everything recorded so far now (tests, and before a snapshot).
  void flush();
  // In a fork child: the file and the writer thread belong to the parent. Never writes again.
  void disable_in_child();

  const std::string& path() const { return path_; }
  uint64_t dropped() const;
  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  // Per-thread buffers created so far (threads that exited hand theirs on).
  size_t thread_buffers() const;

 private:
  struct ThreadBuffer;
  TraceRecorder(int fd, std::string path, const StackTable* stacks, RecorderOptions options);

  ThreadBuffer* attach_thread();
  void wake_writer();
  static void* writer_main(void* self);
  static void on_thread_exit(void* buffer);
  // Requires io_mu_. Drains every ring and writes modules, stacks and events. False on I/O error.
  bool drain_and_write();
  void encode_new_stacks(const std::vector<uint32_t>& ids, std::string* out);
  bool write_out(const std::string& bytes);

  const int fd_;
  const std::string path_;
  const StackTable* const stacks_;
  const RecorderOptions options_;
  const uint64_t generation_;  // tells this recorder's thread buffers from an earlier one's
  std::atomic<bool> accepting_{true};
  Symbolizer::PythonResolver python_resolver_;  // guarded by registry_mu_

  // Thread buffers: created on a thread's first event, recycled after the thread exits.
  mutable std::mutex registry_mu_;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers_;
  std::vector<ThreadBuffer*> idle_buffers_;
  std::vector<DeviceInfo> pending_devices_;
  pthread_key_t exit_key_{};
  bool exit_key_ok_ = false;

  // Writer side: everything below is used under io_mu_ only.
  std::mutex io_mu_;
  bool finished_ = false;
  bool child_ = false;
  bool io_failed_ = false;
  // The file fd_ was opened on: a program that closes descriptors it does not know of, or dup2s
  // over ours, hands fd_'s number to a file of its own, which must never get trace bytes nor be
  // closed by us. fd_lost_: that happened, fd_ is no longer ours.
  dev_t file_dev_ = 0;
  ino_t file_ino_ = 0;
  bool file_known_ = false;
  bool fd_lost_ = false;
  std::vector<TraceEvent> batch_;
  std::string out_;
  TraceModuleTable modules_;
  absl::flat_hash_set<uint32_t> written_stacks_;
  absl::flat_hash_set<uint32_t> written_pyframes_;
  uint64_t drains_ = 0;
  std::atomic<uint64_t> written_{0};

  // Waking the writer: producers bump the word and call futex only when the writer sleeps.
  std::atomic<uint32_t> wake_word_{0};
  std::atomic<bool> writer_sleeping_{false};
  std::atomic<bool> stop_{false};
  pthread_t writer_{};
  bool writer_started_ = false;
};

}  // namespace gpushim::trace
