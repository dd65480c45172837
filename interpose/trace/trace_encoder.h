// Encodes the payloads of trace chunks (trace_format.h). Pure functions of their input: the writer
// thread calls them, and unit tests round-trip them through analysis/trace_reader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/memory_figures.h"
#include "trace/trace_event.h"

namespace gpushim::trace {

struct HeaderInfo {
  uint32_t version_minor = kVersionMinor;  // what the shim writes; tests write older ones
  int pid = 0;
  std::string exe, host, rank, policy;
  uint64_t start_mono_ns = 0;  // the shim's start: event times are relative to it in reports
  uint64_t start_wall_ns = 0;
  uint32_t stack_depth = 0;
  // The GPUSHIM_* assignments the shim was configured with ("NAME=value"), so that a replay
  // rebuilds exactly the recorded configuration through config/config.h.
  std::vector<std::string> config;
};

struct DeviceInfo {
  int ordinal = 0;
  uint64_t capacity = 0;
  uint64_t limit = 0;  // 0: none
};

struct ModuleInfo {
  uint32_t id = 0;
  std::string path;
  uint64_t bias = 0;         // load bias (l_addr): ELF virtual address = runtime address - bias
  uint64_t begin = 0, end = 0;  // runtime address range of its PT_LOAD segments
  std::string build_id;      // raw bytes of NT_GNU_BUILD_ID, "" if none
};

// A frame word of a stack, coded against the module map.
struct FrameCode {
  uint64_t selector = kFrameRaw;  // kFrameRaw, kFramePython or kFrameModule0 + module id
  uint64_t value = 0;             // address, Python frame id, or offset from the module's bias
};

struct StackInfo {
  uint32_t id = 0;
  std::vector<FrameCode> frames;  // innermost first
};

struct PyFrameInfo {
  uint32_t id = 0;
  std::string function, file;
  int line = 0;
};

// A device's figures at the end (the five of accounting/memory_figures.h, peak_bytes the peak
// allocated, and the pool's), written in the order encode_end says.
struct DeviceTotals : MemoryFigures {
  int ordinal = 0;
  uint64_t peak_reserved = 0;
  uint64_t failed_allocs = 0, ooms = 0;
  // The pool's retries after a failed cudaMalloc (memory_stats()' num_alloc_retries); written
  // after every device's other figures, so absent from the traces of older shims.
  std::optional<uint64_t> alloc_retries;
  // Reserved at the end: all the process holds from the driver on the device, what CUDA's own
  // pools reserve beyond their allocations included, which no event shows (minor 4: written after
  // the retries, so absent from the traces of older shims).
  std::optional<uint64_t> reserved;
};

struct EndInfo {
  uint64_t end_mono_ns = 0;
  uint64_t events_written = 0;
  uint64_t events_dropped = 0;
  std::vector<DeviceTotals> devices;  // the shim's own counters at the end
  // When the Python interpreter's teardown began (CLOCK_MONOTONIC, as end_mono_ns; 0: not seen, or
  // a trace before format 1.5). A report's live figures are of that moment; a reader of the trace
  // takes its live figures there too (analysis/run_view.cpp).
  uint64_t teardown_mono_ns = 0;
};

std::string encode_header(const HeaderInfo& h);
std::string encode_device(const DeviceInfo& d);
std::string encode_modules(const std::vector<ModuleInfo>& modules);
std::string encode_stacks(const std::vector<StackInfo>& stacks);
std::string encode_pyframes(const std::vector<PyFrameInfo>& frames);
std::string encode_end(const EndInfo& e);

// Delta-codes events into one kEvents payload. Deltas restart with every payload, so each chunk
// decodes on its own.
class EventEncoder {
 public:
  explicit EventEncoder(std::string* payload) : out_(payload) {}
  void add(const TraceEvent& e);
  // Writes the payload: base time, count, then the events added so far.
  void finish();
  size_t count() const { return count_; }
  size_t bytes() const { return body_.size(); }

 private:
  std::string* out_;
  std::string body_;
  size_t count_ = 0;
  bool first_ = true;
  uint64_t base_t_ = 0, prev_t_ = 0, prev_addr_ = 0, prev_stream_ = 0;
  uint32_t prev_stack_ = 0;
  int16_t prev_device_ = 0;
  uint8_t prev_flags_ = 0;
  std::vector<std::pair<int16_t, uint64_t>> prev_seq_;  // per device, for kFlagSequenced
};

// The previous sequence number of `device` in `state` (0 if none yet), updated to `seq`.
uint64_t exchange_seq(std::vector<std::pair<int16_t, uint64_t>>* state, int16_t device, uint64_t seq);

}  // namespace gpushim::trace
