#include "trace/trace_encoder.h"

namespace gpushim::trace {

std::string encode_header(const HeaderInfo& h) {
  std::string p;
  put_varint(&p, kVersionMajor);
  put_varint(&p, h.version_minor);
  put_varint(&p, static_cast<uint64_t>(h.pid));
  put_string(&p, h.exe);
  put_string(&p, h.host);
  put_string(&p, h.rank);
  put_string(&p, h.policy);
  put_varint(&p, h.start_mono_ns);
  put_varint(&p, h.start_wall_ns);
  put_varint(&p, h.stack_depth);
  put_varint(&p, h.config.size());
  for (const std::string& c : h.config) put_string(&p, c);
  return p;
}

std::string encode_device(const DeviceInfo& d) {
  std::string p;
  put_varint(&p, zigzag(d.ordinal));
  put_varint(&p, d.capacity);
  put_varint(&p, d.limit);
  return p;
}

std::string encode_modules(const std::vector<ModuleInfo>& modules) {
  std::string p;
  put_varint(&p, modules.size());
  for (const ModuleInfo& m : modules) {
    put_varint(&p, m.id);
    put_string(&p, m.path);
    put_varint(&p, m.bias);
    put_varint(&p, m.begin);
    put_varint(&p, m.end - m.begin);
    put_string(&p, m.build_id);
  }
  return p;
}

std::string encode_stacks(const std::vector<StackInfo>& stacks) {
  std::string p;
  put_varint(&p, stacks.size());
  for (const StackInfo& s : stacks) {
    put_varint(&p, s.id);
    put_varint(&p, s.frames.size());
    for (const FrameCode& f : s.frames) {
      put_varint(&p, f.selector);
      put_varint(&p, f.value);
    }
  }
  return p;
}

std::string encode_pyframes(const std::vector<PyFrameInfo>& frames) {
  std::string p;
  put_varint(&p, frames.size());
  for (const PyFrameInfo& f : frames) {
    put_varint(&p, f.id);
    put_string(&p, f.function);
    put_string(&p, f.file);
    put_varint(&p, static_cast<uint64_t>(f.line < 0 ? 0 : f.line));
  }
  return p;
}

std::string encode_end(const EndInfo& e) {
  std::string p;
  put_varint(&p, e.end_mono_ns);
  put_varint(&p, e.events_written);
  put_varint(&p, e.events_dropped);
  put_varint(&p, e.devices.size());
  for (const DeviceTotals& d : e.devices) {
    put_varint(&p, zigzag(d.ordinal));
    put_varint(&p, d.live_bytes);
    put_varint(&p, d.live_count);
    put_varint(&p, d.peak_bytes);
    put_varint(&p, d.peak_reserved);
    put_varint(&p, d.total_allocs);
    put_varint(&p, d.total_frees);
    put_varint(&p, d.failed_allocs);
    put_varint(&p, d.ooms);
  }
  // Added after the per-device figures, each after the last, which an older reader stops at.
  for (const DeviceTotals& d : e.devices) put_varint(&p, d.alloc_retries.value_or(0));
  for (const DeviceTotals& d : e.devices) put_varint(&p, d.reserved.value_or(0));
  put_varint(&p, e.teardown_mono_ns);
  return p;
}

void EventEncoder::add(const TraceEvent& e) {
  if (first_) {
    base_t_ = prev_t_ = e.t_ns;
    first_ = false;
  }
  const bool has_stack = e.kind == EventKind::kAlloc || e.kind == EventKind::kOom;
  uint8_t tag = static_cast<uint8_t>(e.kind) & kTagKindMask;
  if (e.stream != prev_stream_) tag |= kTagStream;
  if (e.device != prev_device_) tag |= kTagDevice;
  if (e.flags != prev_flags_) tag |= kTagFlags;
  if (has_stack && e.stack != prev_stack_) tag |= kTagStack;
  put_u8(&body_, tag);
  put_varint(&body_, zigzag(static_cast<int64_t>(e.t_ns - prev_t_)));
  prev_t_ = e.t_ns;
  if (tag & kTagStream) put_varint(&body_, prev_stream_ = e.stream);
  if (tag & kTagDevice) put_varint(&body_, zigzag(prev_device_ = e.device));
  if (tag & kTagFlags) put_u8(&body_, prev_flags_ = e.flags);
  if (tag & kTagStack) put_varint(&body_, prev_stack_ = e.stack);
  auto put_addr = [&] {
    put_varint(&body_, zigzag(static_cast<int64_t>(e.addr - prev_addr_)));
    prev_addr_ = e.addr;
  };
  switch (e.kind) {
    case EventKind::kAlloc:
      put_addr();
      put_varint(&body_, e.requested);
      put_varint(&body_, zigzag(static_cast<int64_t>(e.size - e.requested)));
      break;
    case EventKind::kFree:
      put_addr();
      break;
    case EventKind::kSegmentAlloc:
    case EventKind::kSegmentFree:
    case EventKind::kSegmentMap:
    case EventKind::kSegmentUnmap:
    case EventKind::kVaReserve:
    case EventKind::kVaFree:
      put_addr();
      put_varint(&body_, e.size);
      break;
    case EventKind::kOom:
      put_varint(&body_, e.requested);
      put_varint(&body_, e.size);
      break;
    case EventKind::kIteration:
    case EventKind::kDropped:
      put_varint(&body_, e.size);
      break;
    case EventKind::kReuse:
      put_varint(&body_, e.requested);
      put_varint(&body_, e.size);
      put_varint(&body_, e.addr);
      break;
    case EventKind::kCheckpoint:
      put_varint(&body_, e.size);
      put_varint(&body_, e.requested);
      break;
    case EventKind::kStreamRetired:
      put_varint(&body_, e.size);
      break;
  }
  if (e.flags & kFlagSequenced)
    put_varint(&body_, zigzag(static_cast<int64_t>(e.seq - exchange_seq(&prev_seq_, e.device, e.seq))));
  ++count_;
}

uint64_t exchange_seq(std::vector<std::pair<int16_t, uint64_t>>* state, int16_t device, uint64_t seq) {
  for (auto& [d, s] : *state) {
    if (d != device) continue;
    const uint64_t prev = s;
    s = seq;
    return prev;
  }
  state->emplace_back(device, seq);
  return 0;
}

void EventEncoder::finish() {
  put_varint(out_, base_t_);
  put_varint(out_, count_);
  out_->append(body_);
}

}  // namespace gpushim::trace
