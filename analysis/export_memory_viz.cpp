// PyTorch memory snapshot export (design-notes §7). The viewer rebuilds every earlier state by
// walking device_traces backwards from segments, so the two must agree exactly: this file replays
// the trace forward with the same rules and writes the end state it arrives at.
#include <algorithm>
#include <functional>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "accounting/allocation_tracker.h"
#include "exports.h"
#include "offline_symbolizer.h"
#include "pickle_writer.h"
#include "trace/trace_format.h"
#include "util/units.h"

namespace gpushim::analysis {
namespace {

enum class Action { kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kSegmentMap, kSegmentUnmap, kOom };

const char* action_name(Action a) {
  switch (a) {
    case Action::kAlloc: return "alloc";
    case Action::kFreeRequested: return "free_requested";
    case Action::kFreeCompleted: return "free_completed";
    case Action::kSegmentAlloc: return "segment_alloc";
    case Action::kSegmentFree: return "segment_free";
    case Action::kSegmentMap: return "segment_map";
    case Action::kSegmentUnmap: return "segment_unmap";
    case Action::kOom: return "oom";
  }
  return "";
}

struct Entry {
  Action action;
  uint64_t addr = 0, size = 0, stream = 0, t_us = 0, device_free = 0;
  uint32_t stack = 0;
};

struct Segment {
  uint64_t addr = 0, size = 0, stream = 0;
  bool mapped = false;      // vmm mappings: adjacent ones merge, as expandable segments do
  bool synthetic = false;   // made for memory CUDA served directly (passthrough, capture)
  uint64_t end() const { return addr + size; }
};

struct Block {
  uint64_t addr = 0, size = 0, requested = 0, stream = 0;
  uint32_t stack = 0;
};

struct DeviceModel {
  std::map<uint64_t, Segment> segments;
  std::map<uint64_t, Block> blocks;
  std::vector<Entry> entries;
  uint64_t repairs = 0;
  // Bytes mapped at a second address (kFlagSharedMapping), now and at most: drawn in two segments,
  // so the viewer's total of segment sizes is above what the device reserved by that much.
  uint64_t shared_mapped = 0, shared_mapped_peak = 0;
  // segment_alloc/segment_map entries still without frames, by address: the trace records no stack
  // for a pool's segment, so each takes the stack of the first allocation placed in it (the one
  // that made the pool grow, as PyTorch's own segment_alloc events carry). Without frames, memory_viz
  // shows "allocated before _record_history was enabled".
  std::map<uint64_t, size_t> unstacked;

  void give_frames(uint64_t addr, uint64_t size, uint32_t stack) {
    if (stack == 0 || unstacked.empty()) return;
    auto it = unstacked.upper_bound(addr);
    if (it != unstacked.begin()) --it;
    while (it != unstacked.end() && it->first < addr + size) {
      Entry& seg = entries[it->second];
      if (seg.addr + seg.size > addr) {
        seg.stack = stack;
        it = unstacked.erase(it);
      } else {
        ++it;
      }
    }
  }

  Segment* containing(uint64_t addr, uint64_t size) {
    auto it = segments.upper_bound(addr);
    if (it == segments.begin()) return nullptr;
    --it;
    return addr >= it->second.addr && addr + size <= it->second.end() ? &it->second : nullptr;
  }
  bool overlaps_segment(uint64_t addr, uint64_t size) {
    auto it = segments.lower_bound(addr + size);
    if (it == segments.begin()) return false;
    --it;
    return it->second.end() > addr;
  }
  // Blocks still inside [addr, addr+size) when their memory goes away: an incomplete trace.
  void drop_blocks_in(uint64_t addr, uint64_t size, uint64_t t_us) {
    auto it = blocks.lower_bound(addr);
    while (it != blocks.end() && it->first < addr + size) {
      const Block& b = it->second;
      entries.push_back(Entry{Action::kFreeRequested, b.addr, b.size, b.stream, t_us, 0, b.stack});
      entries.push_back(Entry{Action::kFreeCompleted, b.addr, b.size, b.stream, t_us, 0, b.stack});
      it = blocks.erase(it);
      ++repairs;
    }
  }
  void add_segment(const Segment& s, Action action, uint64_t t_us, uint32_t stack = 0) {
    segments[s.addr] = s;
    if (stack == 0) unstacked[s.addr] = entries.size();
    entries.push_back(Entry{action, s.addr, s.size, s.stream, t_us, 0, stack});
  }
  void map_range(uint64_t addr, uint64_t size, uint64_t t_us) {
    unstacked[addr] = entries.size();
    entries.push_back(Entry{Action::kSegmentMap, addr, size, 0, t_us, 0, 0});
    Segment s{addr, size, 0, true, false};
    auto next = segments.find(addr + size);
    if (next != segments.end() && next->second.mapped && next->second.stream == 0) {
      s.size += next->second.size;
      segments.erase(next);
    }
    auto it = segments.lower_bound(addr);
    if (it != segments.begin()) {
      --it;
      if (it->second.mapped && it->second.end() == addr && it->second.stream == 0) {
        it->second.size += s.size;
        return;
      }
    }
    segments[addr] = s;
  }
  void unmap_range(uint64_t addr, uint64_t size, uint64_t t_us) {
    Segment* s = containing(addr, size);
    if (s == nullptr || !s->mapped) {
      ++repairs;  // nothing mapped there as far as the trace knows
      return;
    }
    drop_blocks_in(addr, size, t_us);
    unstacked.erase(addr);
    entries.push_back(Entry{Action::kSegmentUnmap, addr, size, 0, t_us, 0, 0});
    const Segment whole = *s;
    segments.erase(whole.addr);
    if (addr > whole.addr) segments[whole.addr] = Segment{whole.addr, addr - whole.addr, 0, true, false};
    if (addr + size < whole.end())
      segments[addr + size] = Segment{addr + size, whole.end() - (addr + size), 0, true, false};
  }
};

// A frame list as the viewer reads it, in gpushim's order (innermost first): the same for traces and
// reports. A frame without a function is named by its module and address; its file and line are
// fields of their own.
void write_frames(PickleWriter& p, const std::vector<FrameInfo>& frames) {
  p.begin_list();
  for (const FrameInfo& f : frames) {
    if (is_plumbing_frame(f)) continue;
    p.begin_dict();
    p.interned("filename");
    p.interned(!f.file.empty() ? f.file : f.module);
    p.interned("line");
    p.integer(f.line);
    p.interned("name");
    if (!f.function.empty()) {
      p.interned(f.function);
    } else {
      FrameInfo bare = f;
      bare.file.clear();
      p.interned(describe_frame(bare));
    }
    p.end_dict();
  }
  p.end_list();
}

// Frame lists are shared by reference in the pickle: each stack is written once.
class FrameWriter {
 public:
  FrameWriter(PickleWriter& p, OfflineSymbolizer& sym) : p_(p), sym_(sym) {}
  void frames(uint32_t stack) {
    auto it = memo_.find(stack);
    if (it != memo_.end()) return p_.get(it->second);
    write_frames(p_, sym_.stack(stack));
    memo_.emplace(stack, p_.memoize());
  }

 private:
  PickleWriter& p_;
  OfflineSymbolizer& sym_;
  absl::flat_hash_map<uint32_t, uint32_t> memo_;
};

void write_segment(PickleWriter& p, int device, const Segment& s, const std::vector<const Block*>& blocks,
                   const std::function<void(const Block&)>& block_frames) {
  uint64_t allocated = 0, requested = 0;
  for (const Block* b : blocks) allocated += b->size, requested += b->requested;
  p.begin_dict();
  p.interned("device");
  p.integer(device);
  p.interned("address");
  p.unsigned_integer(s.addr);
  p.interned("total_size");
  p.unsigned_integer(s.size);
  p.interned("allocated_size");
  p.unsigned_integer(allocated);
  p.interned("active_size");
  p.unsigned_integer(allocated);
  p.interned("requested_size");
  p.unsigned_integer(requested);
  p.interned("stream");
  p.unsigned_integer(s.stream);
  p.interned("segment_type");
  p.interned(s.size <= (2ull << 20) ? "small" : "large");
  p.interned("is_expandable");
  p.boolean(s.mapped);
  p.interned("frames");
  p.begin_list();
  p.end_list();
  p.interned("blocks");
  p.begin_list();
  // Blocks tile the segment: gaps between live blocks are inactive (free) blocks.
  uint64_t at = s.addr;
  auto gap = [&](uint64_t size) {
    p.begin_dict();
    p.interned("address");
    p.unsigned_integer(at);
    p.interned("size");
    p.unsigned_integer(size);
    p.interned("requested_size");
    p.integer(0);
    p.interned("state");
    p.interned("inactive");
    p.interned("frames");
    p.begin_list();
    p.end_list();
    p.end_dict();
  };
  for (const Block* b : blocks) {
    if (b->addr > at) gap(b->addr - at);
    p.begin_dict();
    p.interned("address");
    p.unsigned_integer(b->addr);
    p.interned("size");
    p.unsigned_integer(b->size);
    p.interned("requested_size");
    p.unsigned_integer(b->requested);
    p.interned("state");
    p.interned("active_allocated");
    p.interned("frames");
    block_frames(*b);
    p.end_dict();
    at = b->addr + b->size;
  }
  if (at < s.end()) gap(s.end() - at);
  p.end_list();
  p.end_dict();
}

}  // namespace

std::string memory_viz_from_trace(const TraceData& trace, OfflineSymbolizer& sym, size_t max_events,
                                  std::vector<std::string>* notes) {
  std::map<int, DeviceModel> devices;
  for (const trace::DeviceInfo& d : trace.devices) devices[d.ordinal];
  uint64_t skipped_frees = 0;
  // What a handle keys (CUDA arrays, cuMemCreate: trace::keyed_by_handle) has no address: handles
  // lie bytes apart, their memory megabytes long, so laid out at the keys they would overlap and
  // the viewer would see each one's memory lost. Each gets addresses of its own, above every user
  // address (2^47) and below 2^53, which the viewer's JavaScript still holds exactly.
  std::map<uint64_t, uint64_t> handle_addr;
  uint64_t next_handle_addr = 1ull << 52;
  for (const TraceEvent& recorded : trace.events) {
    TraceEvent e = recorded;
    if ((e.kind == EventKind::kAlloc || e.kind == EventKind::kFree) && trace::keyed_by_handle(e.addr)) {
      if (e.kind == EventKind::kAlloc) {
        e.addr = handle_addr[recorded.addr] = next_handle_addr;
        next_handle_addr += (e.size + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20);
      } else if (auto it = handle_addr.find(recorded.addr); it != handle_addr.end()) {
        e.addr = it->second;
        handle_addr.erase(it);
      }
    }
    if ((e.kind == EventKind::kAlloc || e.kind == EventKind::kFree) &&
        (e.flags & trace::kFlagKindMask) != static_cast<uint8_t>(MemoryKind::kDevice))
      continue;
    if (e.kind == EventKind::kIteration || e.kind == EventKind::kDropped || e.kind == EventKind::kCheckpoint) continue;
    DeviceModel& d = devices[e.device];
    const uint64_t t_us = e.t_ns >= trace.header.start_mono_ns ? (e.t_ns - trace.header.start_mono_ns) / 1000 : 0;
    switch (e.kind) {
      case EventKind::kSegmentAlloc:
        if (d.overlaps_segment(e.addr, e.size)) {
          ++d.repairs;
          break;
        }
        d.add_segment(Segment{e.addr, e.size, 0, false, false}, Action::kSegmentAlloc, t_us);
        break;
      case EventKind::kSegmentFree: {
        auto it = d.segments.find(e.addr);
        if (it == d.segments.end()) {
          ++d.repairs;
          break;
        }
        d.drop_blocks_in(it->second.addr, it->second.size, t_us);
        d.unstacked.erase(e.addr);
        d.entries.push_back(Entry{Action::kSegmentFree, e.addr, it->second.size, it->second.stream, t_us, 0, 0});
        d.segments.erase(it);
        break;
      }
      case EventKind::kSegmentMap:
        d.map_range(e.addr, e.size, t_us);
        if (e.flags & trace::kFlagSharedMapping)
          d.shared_mapped_peak = std::max(d.shared_mapped_peak, d.shared_mapped += e.size);
        break;
      case EventKind::kSegmentUnmap:
        d.unmap_range(e.addr, e.size, t_us);
        if (e.flags & trace::kFlagSharedMapping) d.shared_mapped -= std::min(d.shared_mapped, e.size);
        break;
      case EventKind::kAlloc: {
        if (e.size == 0) break;
        // A block already there means its free was lost: let it go first.
        d.drop_blocks_in(e.addr, e.size, t_us);
        auto before = d.blocks.lower_bound(e.addr);
        if (before != d.blocks.begin()) {
          --before;
          if (before->second.addr + before->second.size > e.addr) d.drop_blocks_in(before->second.addr, 1, t_us);
        }
        if (d.containing(e.addr, e.size) == nullptr) {
          // Memory CUDA served directly is a segment of its own, as with PyTorch's cudaMalloc.
          if (!(e.flags & trace::kFlagForwarded)) ++d.repairs;
          if (d.overlaps_segment(e.addr, e.size)) {
            ++d.repairs;
            break;
          }
          d.add_segment(Segment{e.addr, e.size, e.stream, false, true}, Action::kSegmentAlloc, t_us, e.stack);
        }
        d.give_frames(e.addr, e.size, e.stack);
        d.blocks[e.addr] = Block{e.addr, e.size, e.requested, e.stream, e.stack};
        d.entries.push_back(Entry{Action::kAlloc, e.addr, e.size, e.stream, t_us, 0, e.stack});
        break;
      }
      case EventKind::kFree: {
        auto it = d.blocks.find(e.addr);
        if (it == d.blocks.end()) {
          ++skipped_frees;
          break;
        }
        const Block b = it->second;
        d.blocks.erase(it);
        d.entries.push_back(Entry{Action::kFreeRequested, b.addr, b.size, b.stream, t_us, 0, b.stack});
        d.entries.push_back(Entry{Action::kFreeCompleted, b.addr, b.size, b.stream, t_us, 0, b.stack});
        auto seg = d.segments.find(b.addr);
        if (seg != d.segments.end() && seg->second.synthetic) {
          d.entries.push_back(Entry{Action::kSegmentFree, seg->second.addr, seg->second.size, seg->second.stream, t_us, 0, 0});
          d.segments.erase(seg);
        }
        break;
      }
      case EventKind::kOom:
        d.entries.push_back(Entry{Action::kOom, 0, e.requested, e.stream, t_us, e.size, e.stack});
        break;
      default: break;
    }
  }

  PickleWriter p;
  FrameWriter frames(p, sym);
  p.begin_dict();
  p.interned("segments");
  p.begin_list();
  for (auto& [ord, d] : devices) {
    for (const auto& [addr, s] : d.segments) {
      std::vector<const Block*> inside;
      for (auto it = d.blocks.lower_bound(s.addr); it != d.blocks.end() && it->first < s.end(); ++it)
        inside.push_back(&it->second);
      write_segment(p, ord, s, inside, [&](const Block& b) { frames.frames(b.stack); });
    }
  }
  p.end_list();
  p.interned("device_traces");
  p.begin_list();
  const int max_device = devices.empty() ? -1 : devices.rbegin()->first;
  for (int ord = 0; ord <= max_device; ++ord) {
    p.begin_list();
    auto it = devices.find(ord);
    if (it != devices.end()) {
      std::vector<Entry>& entries = it->second.entries;
      size_t first = 0;
      if (max_events && entries.size() > max_events) {
        first = entries.size() - max_events;
        // Never split a free_requested/free_completed pair.
        if (entries[first].action == Action::kFreeCompleted) ++first;
        notes->push_back("device " + std::to_string(ord) + ": kept the newest " + std::to_string(entries.size() - first) +
                         " of " + std::to_string(entries.size()) + " events (--max-events)");
      }
      for (size_t i = first; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        p.begin_dict();
        p.interned("action");
        p.interned(action_name(e.action));
        p.interned("addr");
        p.unsigned_integer(e.addr);
        p.interned("size");
        p.unsigned_integer(e.size);
        p.interned("stream");
        p.unsigned_integer(e.stream);
        p.interned("time_us");
        p.unsigned_integer(e.t_us);
        if (e.action == Action::kOom) {
          p.interned("device_free");
          p.unsigned_integer(e.device_free);
        }
        p.interned("frames");
        if (e.stack != 0) frames.frames(e.stack);
        else {
          p.begin_list();
          p.end_list();
        }
        p.end_dict();
      }
      if (it->second.shared_mapped_peak)
        notes->push_back("device " + std::to_string(ord) + ": up to " + format_bytes(it->second.shared_mapped_peak) +
                         " of the segments (" + format_bytes(it->second.shared_mapped) +
                         " at the end) was memory mapped at two addresses and is drawn at each: the viewer's "
                         "total is that much above what the device reserved (docs/trace-format.md, flag 0x40)");
      if (it->second.repairs)
        notes->push_back("device " + std::to_string(ord) + ": " + std::to_string(it->second.repairs) +
                         " inconsistencies of an incomplete trace were smoothed over");
    }
    p.end_list();
  }
  p.end_list();
  p.end_dict();
  if (skipped_frees) notes->push_back(std::to_string(skipped_frees) + " frees of unknown blocks skipped");
  return p.finish();
}

std::string memory_viz_from_run(const RunView& run) {
  PickleWriter p;
  p.begin_dict();
  p.interned("segments");
  p.begin_list();
  int max_device = -1;
  for (const DeviceReport& d : run.meta.devices) max_device = std::max(max_device, d.device);
  uint64_t addr = 0x7f0000000000ull;
  for (const SiteView& s : run.sites) {
    if (s.kind != "device" || s.live_bytes == 0) continue;
    max_device = std::max(max_device, s.device);
    const Segment seg{addr, s.live_bytes, 0, false, false};
    const Block b{addr, s.live_bytes, s.live_bytes, 0, 0};
    write_segment(p, s.device, seg, {&b}, [&](const Block&) {
      write_frames(p, s.frames);  // no symbolizer here: the report's frames are already resolved
    });
    addr += (s.live_bytes + (4ull << 20) - 1) / (2ull << 20) * (2ull << 20);
  }
  p.end_list();
  p.interned("device_traces");
  p.begin_list();
  for (int d = 0; d <= max_device; ++d) {
    p.begin_list();
    p.end_list();
  }
  p.end_list();
  p.end_dict();
  return p.finish();
}

}  // namespace gpushim::analysis
