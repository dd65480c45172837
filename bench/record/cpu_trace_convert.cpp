// Converts a log of the CPU allocation recorder (cpu_alloc_recorder.cpp) into a gpushim trace
// (docs/trace-format.md), written with the shim's own encoder so that the format lives in one place.
//
//   gpushim_cpu_trace_convert RAW OUT.trace NAME
//
// Every tensor storage becomes an alloc on device 0, stream 0 (legacy default stream: the CPU has
// no streams), of exactly the bytes PyTorch asked for; its free a free; each step mark an iteration
// mark. The header says policy "passthrough" and every alloc and free carries the forwarded flag,
// as the shim writes a passthrough trace: the recording ran on PyTorch's uncached CPU allocator, so
// sizes are the requests and reserved memory is what is live. The device's capacity is unknown
// (0): a replay then simulates an unbounded device unless --capacity says otherwise.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_raw_record.h"
#include "trace/trace_encoder.h"
#include "trace/trace_format.h"

namespace {

using gpushim::trace::ChunkType;
using gpushim::trace::EventKind;
using gpushim::trace::TraceEvent;

bool read_all(const char* path, std::vector<gpushim_bench::RawRecord>* out) {
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return false;
  gpushim_bench::RawRecord r;
  while (std::fread(&r, sizeof(r), 1, f) == 1) out->push_back(r);
  std::fclose(f);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s RAW OUT.trace NAME\n", argv[0]);
    return 2;
  }
  std::vector<gpushim_bench::RawRecord> raw;
  if (!read_all(argv[1], &raw) || raw.empty()) {
    std::fprintf(stderr, "%s: cannot read records from %s\n", argv[0], argv[1]);
    return 1;
  }

  std::string file(gpushim::trace::kFileMagic, sizeof(gpushim::trace::kFileMagic));
  gpushim::trace::HeaderInfo h;
  h.exe = std::string("python3 bench/record/models.py ") + argv[3];
  h.host = "cpu-recording";
  h.policy = "passthrough";
  h.start_mono_ns = raw.front().t_ns;
  gpushim::trace::append_chunk(&file, ChunkType::kHeader, gpushim::trace::encode_header(h));
  gpushim::trace::DeviceInfo dev;  // ordinal 0, capacity unknown, no cap
  gpushim::trace::append_chunk(&file, ChunkType::kDevice, gpushim::trace::encode_device(dev));

  std::unordered_map<uint64_t, uint64_t> live;  // address -> size
  uint64_t allocated = 0, peak = 0, allocs = 0, frees = 0, unmatched = 0, marks = 0, written = 0;
  std::string payload;
  auto flush = [&](gpushim::trace::EventEncoder& enc) {
    if (enc.count() == 0) return;
    enc.finish();
    gpushim::trace::append_chunk(&file, ChunkType::kEvents, payload);
    written += enc.count();
    payload.clear();
  };
  auto enc = std::make_unique<gpushim::trace::EventEncoder>(&payload);
  for (const gpushim_bench::RawRecord& r : raw) {
    TraceEvent e;
    e.t_ns = r.t_ns;
    if (r.kind == gpushim_bench::kRawAlloc) {
      if (live.count(r.ptr) != 0) continue;  // cannot happen: the recorder logs a free first
      e.kind = EventKind::kAlloc;
      e.flags = gpushim::trace::kFlagForwarded;
      e.addr = r.ptr;
      e.size = e.requested = r.size;
      live[r.ptr] = r.size;
      allocated += r.size;
      peak = std::max(peak, allocated);
      ++allocs;
    } else if (r.kind == gpushim_bench::kRawFree) {
      auto it = live.find(r.ptr);
      if (it == live.end()) {
        ++unmatched;
        continue;
      }
      e.kind = EventKind::kFree;
      e.flags = gpushim::trace::kFlagForwarded;
      e.addr = r.ptr;
      allocated -= it->second;
      live.erase(it);
      ++frees;
    } else if (r.kind == gpushim_bench::kRawMark) {
      e.kind = EventKind::kIteration;
      e.size = ++marks;
    } else {
      continue;
    }
    enc->add(e);
    if (enc->bytes() > 60000) {
      flush(*enc);
      enc = std::make_unique<gpushim::trace::EventEncoder>(&payload);
    }
  }
  flush(*enc);

  gpushim::trace::EndInfo end;
  end.end_mono_ns = raw.back().t_ns;
  end.events_written = written;
  gpushim::trace::DeviceTotals t;
  t.live_bytes = allocated;
  t.live_count = live.size();
  t.peak_bytes = t.peak_reserved = peak;
  t.reserved = allocated;  // every allocation forwarded: held from the driver as it is
  t.total_allocs = allocs;
  t.total_frees = frees;
  end.devices.push_back(t);
  gpushim::trace::append_chunk(&file, ChunkType::kEnd, gpushim::trace::encode_end(end));

  FILE* f = std::fopen(argv[2], "wb");
  if (f == nullptr || std::fwrite(file.data(), 1, file.size(), f) != file.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "%s: cannot write %s\n", argv[0], argv[2]);
    return 1;
  }
  std::printf("%s: %" PRIu64 " allocs, %" PRIu64 " frees, %" PRIu64 " steps, peak %" PRIu64 " B, %zu live at exit, %" PRIu64
              " unmatched frees, %zu bytes\n",
              argv[3], allocs, frees, marks, peak, live.size(), unmatched, file.size());
  return 0;
}
