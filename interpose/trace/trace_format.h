// The GPUSHIM_TRACE file format, shared by the writer (interpose/trace) and the reader
// (analysis/trace_reader). docs/trace-format.md is the prose version of this file; keep them in
// step. Everything here is plain data and byte coding: no I/O, no state.
//
// A trace is an 8-byte magic, then self-delimiting chunks. Each chunk has a fixed 16-byte header
// (sync word, type, payload length, CRC-32 of header and payload), so a reader stops cleanly at the
// first torn or corrupt chunk: a trace cut by kill -9 reads up to its last complete chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gpushim::trace {

// "GPUSHIMT": the file magic.
inline constexpr char kFileMagic[8] = {'G', 'P', 'U', 'S', 'H', 'I', 'M', 'T'};
// Version of the chunk layouts below. A reader refuses a different major; a minor bump only adds
// chunk types or trailing fields, which old readers skip.
inline constexpr uint32_t kVersionMajor = 1;
inline constexpr uint32_t kVersionMinor = 7;  // 1: kReuse and kCheckpoint events; 2: the end chunk's retries; 3:
                                              // kStreamRetired, kVaReserve, kVaFree; 4: the end chunk's reserved;
                                              // 5: the end chunk's teardown moment; 6: kFlagSharedMapping;
                                              // 7: a checkpoint's kCheckpointAt* flags (util/iteration_counter.h)

inline constexpr uint32_t kChunkSync = 0x4B484347u;  // "GCHK" little-endian
inline constexpr size_t kChunkHeaderSize = 16;
// Writers keep chunks this small, so a crash loses little and readers can refuse absurd lengths.
inline constexpr uint32_t kMaxChunkPayload = 1u << 20;

enum class ChunkType : uint8_t {
  kHeader = 1,    // once, first: process, clock bases, configuration
  kDevice = 2,    // a device the shim started using: ordinal, capacity, cap
  kModules = 3,   // loaded objects (path, load bias, range, build id), appended as they appear
  kStacks = 4,    // new interned stacks, written before the first event that uses them
  kEvents = 5,    // delta-coded events
  kEnd = 6,       // once, last, on a clean exit: totals and the shim's own counters
  kPyFrames = 7,  // Python source locations referenced by stack words (id -> function, file, line)
};

// ---- events ----

enum class EventKind : uint8_t {
  kAlloc = 0,         // addr, size (policy), requested, stack, stream, device, flags
  kFree = 1,          // addr, stream, device, flags (size, requested and stack: those of the alloc)
  kSegmentAlloc = 2,  // a pool took a segment from the driver: addr, size
  kSegmentFree = 3,   // a pool gave a segment back: addr, size
  kSegmentMap = 4,    // vmm: physical memory mapped at addr, size
  kSegmentUnmap = 5,  // vmm: mapping removed
  kOom = 6,           // an allocation refused for lack of memory: requested, size = device free, stack
  kIteration = 7,     // an iteration mark: size = the mark's number (1, 2, ...)
  kDropped = 8,       // size = events the recording thread dropped just before this point
  // (minor 1) A moment that decides when a pool may reuse freed memory, seen by the pool for the
  // first time, in its order (sequenced): requested = ReuseMoment, size = the fence's or event's
  // number in the order the pool recorded them (from 1; the synchronization's number for kSync),
  // addr = how many queries of it had answered "not yet" before. A replay under the recorded
  // policy completes fences and events exactly there (analysis/replay.cpp).
  kReuse = 9,
  // (minor 1) The shim sampled every site for growth (a checkpoint of the growth series): size =
  // iterations counted, requested = their sources. gpushim-analyze judges growth at exactly these.
  kCheckpoint = 10,
  // (minor 3) The pool stopped naming streams the program was ending (cuStreamDestroy, a context's
  // destruction or reset: DeviceMemoryResource::forget_streams): its free blocks freed on them got
  // an event recorded then and are ordered by it alone since. One event per stream whose blocks
  // were retagged, consecutive in the pool's order (sequenced): stream = the handle, size = how
  // many streams that one call forgot. The event numbers of kReuse count those events, and the
  // driver may hand the handle to a later stream: a replay under the recorded policy forgets the
  // same streams at the same point (analysis/replay.cpp).
  kStreamRetired = 11,
  // (minor 3) vmm: the pool reserved a range of virtual addresses (addr, size), or freed one. Where
  // the driver put a range decides where the pool's blocks lie, and best fit breaks ties by
  // address: a replay under the recorded policy reserves where the run's driver did.
  kVaReserve = 12,
  kVaFree = 13,
};
inline constexpr uint8_t kEventKindCount = 14;

enum class ReuseMoment : uint8_t {
  kFenceDone = 0,   // Backend::fence_done answered true
  kFenceWaited = 1, // Backend::wait_fence returned (the host waited for the work before it)
  kEventDone = 2,   // Backend::event_done answered true (a stream-ordered free's event)
  kSync = 3,        // Backend::synchronize succeeded: everything recorded so far completed
};
inline constexpr uint8_t kReuseMomentCount = 4;

// Event flags (the `flags` byte). Memory kind in the low two bits, as in accounting/MemoryKind.
inline constexpr uint8_t kFlagKindMask = 0x3;
inline constexpr uint8_t kFlagStreamOrdered = 0x4;  // cudaMallocAsync / cudaFreeAsync
inline constexpr uint8_t kFlagForwarded = 0x8;      // served by CUDA itself, not by the pool
inline constexpr uint8_t kFlagPitched = 0x10;       // cudaMallocPitch: requested is pitch x height
// The event carries its number in its device's pool order (a zigzag varint delta from the previous
// such number of the same device in the chunk, after the kind's fields). Readers order a device's
// sequenced events by it: timestamps of concurrent pool operations can be inverted, these cannot.
inline constexpr uint8_t kFlagSequenced = 0x20;
// (minor 6) segment_map, segment_unmap: the physical memory is mapped at another address too
// (policy/shared_mappings.h), so the event neither takes nor gives back memory; its address range
// still counts for the layout. Readers of older traces cannot tell: there, reserved memory
// computed from the mappings counts such memory once per address.
inline constexpr uint8_t kFlagSharedMapping = 0x40;

// An event's address that is a handle's key, not an address: a CUDA array (bit 62) or mipmapped
// array (bit 61; accounting/array_books.h), or a cuMemCreate allocation (bit 63;
// accounting/vmm_tracker.h). Memory only CUDA can serve, under every policy, so a replay forwards it
// whatever the recording's policy was.
inline constexpr bool keyed_by_handle(uint64_t addr) { return (addr >> 61) != 0; }

// Tag byte of an event in a kEvents chunk: kind in the low nibble, then which fields changed from
// the previous event of the chunk (unchanged fields are not written).
inline constexpr uint8_t kTagKindMask = 0x0F;
inline constexpr uint8_t kTagStream = 0x10;  // varint stream handle follows
inline constexpr uint8_t kTagDevice = 0x20;  // zigzag varint device follows
inline constexpr uint8_t kTagFlags = 0x40;   // flags byte follows
inline constexpr uint8_t kTagStack = 0x80;   // varint stack id follows (alloc and oom only)

// Stack frame word coding inside kStacks: a varint selector, then its value.
inline constexpr uint64_t kFrameRaw = 0;     // varint absolute address (no module known)
inline constexpr uint64_t kFramePython = 1;  // varint Python frame id (see kPyFrames)
inline constexpr uint64_t kFrameModule0 = 2; // selector - 2 = module id; varint offset from its bias follows

// ---- byte coding ----

inline uint64_t zigzag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
inline int64_t unzigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

inline void put_varint(std::string* out, uint64_t v) {
  char buf[10];
  size_t n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, n);
}
inline void put_u8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
inline void put_u32le(std::string* out, uint32_t v) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
  out->append(b, 4);
}
inline void put_string(std::string* out, std::string_view s) {
  put_varint(out, s.size());
  out->append(s.data(), s.size());
}

// Bounds-checked reading of one chunk payload. Every read reports failure instead of running off
// the end, so a corrupt payload can never make the reader crash.
class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  bool varint(uint64_t* v) {
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      if (shift == 63 && b > 1) return false;  // more than 64 bits
      r |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *v = r;
        return true;
      }
    }
    return false;
  }
  bool u8(uint8_t* v) {
    if (p_ == end_) return false;
    *v = *p_++;
    return true;
  }
  bool string(std::string* s, size_t max_len = 1u << 16) {
    uint64_t n = 0;
    if (!varint(&n) || n > max_len || n > left()) return false;
    s->assign(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// CRC-32 (IEEE 802.3, the zlib polynomial), so `python3 -c 'zlib.crc32(...)'` checks a chunk too.
// The writer's own, not zlib's: it runs inside the host process, and linking zlib would put one more
// DSO (libz.so.1) into every process the shim is preloaded into, CUDA or not, for 20 lines of table.
// The reader (analysis/trace_reader.cpp) checks chunks with zlib's crc32, an independent
// implementation of the same polynomial.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);
// Header bytes covered by the CRC: everything before the CRC field.
inline constexpr size_t kChunkCrcCovered = 12;

// Builds the 16-byte header for `payload` of `type` and appends header + payload to `out`.
void append_chunk(std::string* out, ChunkType type, std::string_view payload);

// Parses the chunk header at `p` (at least kChunkHeaderSize bytes). Returns false if the sync word
// is wrong or the length is absurd; the CRC is checked by the caller once the payload is there.
struct ChunkHeader {
  ChunkType type;
  uint32_t length;
  uint32_t crc;
};
bool parse_chunk_header(const uint8_t* p, ChunkHeader* out);

}  // namespace gpushim::trace
