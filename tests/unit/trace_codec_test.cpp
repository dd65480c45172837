// The trace file format: byte coding, chunk framing, and the reader's behaviour on complete,
// truncated and corrupted files.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "trace/trace_encoder.h"
#include "trace/trace_format.h"
#include "run_view.h"
#include "trace_reader.h"

namespace gpushim::trace {
namespace {

using analysis::chunk_crc_ok;
using analysis::parse_trace;
using analysis::TraceData;

TEST(TraceFormat, VarintsRoundTripAtEveryWidth) {
  std::vector<uint64_t> values = {0, 1, 127, 128, 16383, 16384, (1ull << 32) - 1, 1ull << 32, UINT64_MAX - 1, UINT64_MAX};
  for (int b = 0; b < 64; ++b) values.push_back(1ull << b);
  std::string bytes;
  for (uint64_t v : values) put_varint(&bytes, v);
  ByteReader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  for (uint64_t v : values) {
    uint64_t got = 0;
    ASSERT_TRUE(r.varint(&got));
    EXPECT_EQ(got, v);
  }
  EXPECT_TRUE(r.done());
  uint64_t dummy;
  EXPECT_FALSE(r.varint(&dummy));
}

TEST(TraceFormat, OverlongVarintIsRefused) {
  const std::string eleven(11, '\xff');
  ByteReader r(reinterpret_cast<const uint8_t*>(eleven.data()), eleven.size());
  uint64_t v;
  EXPECT_FALSE(r.varint(&v));
}

TEST(TraceFormat, ZigzagKeepsSmallMagnitudesSmall) {
  for (int64_t v : std::initializer_list<int64_t>{0, -1, 1, -2, 1000, -1000, INT64_MIN, INT64_MAX}) EXPECT_EQ(unzigzag(zigzag(v)), v);
  EXPECT_EQ(zigzag(-1), 1u);
  EXPECT_EQ(zigzag(1), 2u);
}

TEST(TraceFormat, Crc32IsTheZlibOne) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(crc32("", 0), 0u);
}

TEST(TraceFormat, ChunkHeaderAndChecksum) {
  std::string out;
  append_chunk(&out, ChunkType::kEvents, "payload");
  ASSERT_EQ(out.size(), kChunkHeaderSize + 7);
  ChunkHeader h;
  const auto* p = reinterpret_cast<const uint8_t*>(out.data());
  ASSERT_TRUE(parse_chunk_header(p, &h));
  EXPECT_EQ(h.type, ChunkType::kEvents);
  EXPECT_EQ(h.length, 7u);
  EXPECT_TRUE(chunk_crc_ok(p, p + kChunkHeaderSize, h.length, h.crc));
  out.back() ^= 1;
  EXPECT_FALSE(chunk_crc_ok(p, p + kChunkHeaderSize, h.length, h.crc));
}

// The writer's CRC-32 (ours, in the shim) and the reader's (zlib's) agree on every length, across
// the slicing boundaries of zlib's.
TEST(TraceFormat, WriterAndReaderChecksumsAgree) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 300; n += 1 + n / 8) {
    std::string payload(n, '\0');
    for (char& c : payload) c = static_cast<char>(rng());
    std::string out;
    append_chunk(&out, ChunkType::kStacks, payload);
    const auto* p = reinterpret_cast<const uint8_t*>(out.data());
    ChunkHeader h;
    ASSERT_TRUE(parse_chunk_header(p, &h));
    EXPECT_TRUE(chunk_crc_ok(p, p + kChunkHeaderSize, h.length, h.crc)) << n;
  }
}

// A realistic stream: allocations and frees of varied sizes on two devices and two streams,
// segments, reuse moments, an OOM, marks and a drop marker, in time order.
std::vector<TraceEvent> sample_events(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TraceEvent> out;
  uint64_t pool_seq = 0;
  std::vector<TraceEvent> live;
  uint64_t t = 1'000'000'000;
  uint64_t next_addr = 0x7f0000000000ull;
  for (size_t i = 0; i < n; ++i) {
    t += 200 + rng() % 5000;
    TraceEvent e;
    e.t_ns = t;
    const unsigned pick = rng() % 100;
    if (pick < 45 || live.empty()) {
      e.kind = EventKind::kAlloc;
      e.requested = 1 + rng() % (8 << 20);
      e.size = (e.requested + 511) / 512 * 512;
      e.addr = next_addr;
      next_addr += e.size + 512 * (rng() % 4);
      e.stack = static_cast<uint32_t>(16 + rng() % 40);
      e.device = static_cast<int16_t>(rng() % 2);
      e.stream = rng() % 3 == 0 ? 0x55550000ull + rng() % 2 : 0;
      e.flags = e.stream ? kFlagStreamOrdered : 0;
      if (e.device == 0) e.flags |= kFlagSequenced;  // pool events of device 0 carry pool numbers
      live.push_back(e);
    } else if (pick < 90) {
      const size_t k = rng() % live.size();
      e = live[k];
      live[k] = live.back();
      live.pop_back();
      e.t_ns = t;
      e.kind = EventKind::kFree;
    } else if (pick < 92) {
      // A reuse moment of device 0's pool: in its order, with no address of its own.
      e.kind = EventKind::kReuse;
      e.requested = rng() % kReuseMomentCount;
      e.size = 1 + rng() % 300;
      e.addr = rng() % 3;
      e.flags = kFlagSequenced;
    } else if (pick < 94) {
      e.kind = rng() % 2 ? EventKind::kSegmentAlloc : EventKind::kSegmentFree;
      e.addr = 0x7e0000000000ull + (rng() % 64) * (2ull << 20);
      e.size = 20ull << 20;
      e.device = static_cast<int16_t>(rng() % 2);
    } else if (pick < 96) {
      e.kind = EventKind::kOom;
      e.requested = 1ull << 34;
      e.size = 12345678;  // device free
      e.stack = 99;
    } else if (pick < 99) {
      e.kind = EventKind::kIteration;
      e.size = i;
    } else {
      e.kind = EventKind::kDropped;
      e.size = 1 + rng() % 10;
    }
    if (e.flags & kFlagSequenced) e.seq = ++pool_seq;
    out.push_back(e);
  }
  return out;
}

// `end_bytes_cut`: bytes left off the end chunk's payload (a shim that wrote fewer figures);
// `end_bytes_added`: appended to it (a newer shim's trailing figures).
// `minor`: the format version the header says; `end_bytes_cut` are cut from the end of what the
// current encoder writes (with teardown_ns 0, its last byte is the teardown's).
std::string build_trace(const std::vector<TraceEvent>& events, size_t per_chunk, bool with_end, size_t end_bytes_cut = 0,
                        const std::string& end_bytes_added = "", uint32_t minor = kVersionMinor,
                        uint64_t teardown_ns = 0) {
  std::string f(kFileMagic, sizeof(kFileMagic));
  HeaderInfo h;
  h.version_minor = minor;
  h.pid = 77;
  h.exe = "/opt/prog";
  h.host = "node";
  h.rank = "5";
  h.policy = "caching";
  h.start_mono_ns = 1'000'000'000;
  h.start_wall_ns = 1'700'000'000'000'000'000ull;
  h.stack_depth = 32;
  h.config = {"GPUSHIM_POLICY=caching", "GPUSHIM_ROUND=1024"};
  append_chunk(&f, ChunkType::kHeader, encode_header(h));
  append_chunk(&f, ChunkType::kDevice, encode_device(DeviceInfo{0, 16ull << 30, 0}));
  append_chunk(&f, ChunkType::kDevice, encode_device(DeviceInfo{1, 16ull << 30, 8ull << 30}));
  ModuleInfo m;
  m.id = 0;
  m.path = "/opt/prog";
  m.bias = 0x555500000000ull;
  m.begin = m.bias;
  m.end = m.bias + 0x10000;
  m.build_id = std::string("\x01\x02\x03", 3);
  append_chunk(&f, ChunkType::kModules, encode_modules({m}));
  std::vector<StackInfo> stacks;
  for (uint32_t id = 16; id < 100; ++id)
    stacks.push_back(StackInfo{id, {FrameCode{kFrameModule0, 0x1234 + id}, FrameCode{kFrameRaw, 0xdead0000ull + id},
                                    FrameCode{kFramePython, id}}});
  append_chunk(&f, ChunkType::kStacks, encode_stacks(stacks));
  for (size_t i = 0; i < events.size(); i += per_chunk) {
    std::string payload;
    EventEncoder enc(&payload);
    for (size_t k = i; k < events.size() && k < i + per_chunk; ++k) enc.add(events[k]);
    enc.finish();
    append_chunk(&f, ChunkType::kEvents, payload);
  }
  if (with_end) {
    EndInfo e;
    e.end_mono_ns = events.empty() ? 0 : events.back().t_ns;
    e.events_written = events.size();
    e.devices.push_back(DeviceTotals{{1, 2, 3, 5, 6}, 0, 4, 7, 8, 9, 10});
    e.teardown_mono_ns = teardown_ns;
    const std::string end = encode_end(e);
    append_chunk(&f, ChunkType::kEnd, end.substr(0, end.size() - end_bytes_cut) + end_bytes_added);
  }
  return f;
}

void expect_same_event(const TraceEvent& got, const TraceEvent& want, size_t i) {
  SCOPED_TRACE(i);
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.t_ns, want.t_ns);
  EXPECT_EQ(got.device, want.device);
  EXPECT_EQ(got.stream, want.stream);
  EXPECT_EQ(got.flags, want.flags);
  EXPECT_EQ(got.seq, want.seq);
  switch (want.kind) {
    case EventKind::kAlloc:
    case EventKind::kFree:  // frees carry their allocation's figures after reading
      EXPECT_EQ(got.addr, want.addr);
      EXPECT_EQ(got.size, want.size);
      EXPECT_EQ(got.requested, want.requested);
      EXPECT_EQ(got.stack, want.stack);
      break;
    case EventKind::kSegmentAlloc:
    case EventKind::kSegmentFree:
      EXPECT_EQ(got.addr, want.addr);
      EXPECT_EQ(got.size, want.size);
      break;
    case EventKind::kOom:
      EXPECT_EQ(got.requested, want.requested);
      EXPECT_EQ(got.size, want.size);
      EXPECT_EQ(got.stack, want.stack);
      break;
    case EventKind::kReuse:
      EXPECT_EQ(got.requested, want.requested);
      EXPECT_EQ(got.size, want.size);
      EXPECT_EQ(got.addr, want.addr);
      break;
    default: EXPECT_EQ(got.size, want.size);
  }
}

// Shims before the pool's retries were written end the chunk after each device's OOMs.
TEST(TraceReader, EndChunksWithoutTheRetriesStillRead) {
  const std::string file = build_trace(sample_events(10, 1), 700, true, /*end_bytes_cut=*/3, "", /*minor=*/1);
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(file, &t, &err)) << err;
  ASSERT_TRUE(t.end.has_value());
  EXPECT_EQ(t.end->devices[0].ooms, 8u);
  EXPECT_FALSE(t.end->devices[0].alloc_retries.has_value());
  EXPECT_FALSE(t.end->devices[0].reserved.has_value());
}

// Shims before format 1.4 end the chunk after each device's retries.
TEST(TraceReader, EndChunksWithoutReservedStillRead) {
  const std::string file = build_trace(sample_events(10, 1), 700, true, /*end_bytes_cut=*/2, "", /*minor=*/3);
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(file, &t, &err)) << err;
  ASSERT_TRUE(t.end.has_value());
  EXPECT_EQ(t.end->devices[0].alloc_retries, std::optional<uint64_t>(9));
  EXPECT_FALSE(t.end->devices[0].reserved.has_value());
}

// Shims before format 1.5 end the chunk after each device's reserved; from 1.5 on, the teardown's
// moment follows (0: none seen).
TEST(TraceReader, EndChunksSayWhenTheTeardownBeganFromFormat15) {
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(build_trace(sample_events(10, 1), 700, true, /*end_bytes_cut=*/1, "", /*minor=*/4), &t, &err))
      << err;
  ASSERT_TRUE(t.end.has_value());
  EXPECT_EQ(t.end->devices[0].reserved, std::optional<uint64_t>(10));
  EXPECT_EQ(t.end->teardown_mono_ns, 0u);
  TraceData t5;
  ASSERT_TRUE(parse_trace(build_trace(sample_events(10, 1), 700, true, 0, "", 5, 1'250'000'000), &t5, &err)) << err;
  ASSERT_TRUE(t5.end.has_value());
  EXPECT_FALSE(t5.truncated) << t5.stop_reason;
  EXPECT_EQ(t5.end->teardown_mono_ns, 1'250'000'000u);
  EXPECT_EQ(t5.end->devices[0].reserved, std::optional<uint64_t>(10));
}

// A newer minor version may add trailing figures: this reader keeps what it knows.
TEST(TraceReader, EndChunksWithANewerShimsFiguresStillRead) {
  const std::string file = build_trace(sample_events(10, 1), 700, true, 0, std::string("\x05\x81\x01", 3));
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(file, &t, &err)) << err;
  ASSERT_TRUE(t.end.has_value());
  EXPECT_FALSE(t.truncated) << t.stop_reason;
  EXPECT_EQ(t.end->devices[0].reserved, std::optional<uint64_t>(10));
}

TEST(TraceReader, ReadsBackEverythingWritten) {
  const auto events = sample_events(5000, 1);
  const std::string file = build_trace(events, 700, true);
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(file, &t, &err)) << err;
  EXPECT_FALSE(t.truncated) << t.stop_reason;
  EXPECT_EQ(t.bytes_used, file.size());
  EXPECT_EQ(t.header.pid, 77);
  EXPECT_EQ(t.header.exe, "/opt/prog");
  EXPECT_EQ(t.header.rank, "5");
  EXPECT_EQ(t.header.policy, "caching");
  EXPECT_EQ(t.header.config.size(), 2u);
  ASSERT_EQ(t.devices.size(), 2u);
  EXPECT_EQ(t.devices[1].limit, 8ull << 30);
  ASSERT_EQ(t.modules.count(0), 1u);
  EXPECT_EQ(t.modules.at(0).build_id, std::string("\x01\x02\x03", 3));
  ASSERT_EQ(t.stacks.count(20), 1u);
  EXPECT_EQ(t.stacks.at(20)[0].value, 0x1234u + 20);
  ASSERT_TRUE(t.end.has_value());
  EXPECT_EQ(t.end->devices[0].peak_bytes, 3u);
  EXPECT_EQ(t.end->devices[0].ooms, 8u);
  EXPECT_EQ(t.end->devices[0].alloc_retries, std::optional<uint64_t>(9));
  EXPECT_EQ(t.end->devices[0].reserved, std::optional<uint64_t>(10));
  EXPECT_EQ(t.unmatched_frees, 0u);
  ASSERT_EQ(t.events.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) expect_same_event(t.events[i], events[i], i);
}

TEST(TraceReader, CompactOnDisk) {
  // Allocation/free traffic only: the coding goal is at most 16 bytes per event.
  std::vector<TraceEvent> events;
  for (const TraceEvent& e : sample_events(20000, 2))
    if (e.kind == EventKind::kAlloc || e.kind == EventKind::kFree) events.push_back(e);
  std::string payload;
  EventEncoder enc(&payload);
  for (const TraceEvent& e : events) enc.add(e);
  enc.finish();
  const double per_event = static_cast<double>(payload.size()) / static_cast<double>(events.size());
  EXPECT_LT(per_event, 16.0);
}

TEST(TraceReader, TruncatedAnywhereReadsTheCompleteChunks) {
  const auto events = sample_events(200, 3);  // every prefix is read: keep the file small
  const std::string file = build_trace(events, 20, true);
  // Where each chunk ends, to know how many events a prefix must give.
  size_t header_end = 0;
  {
    TraceData t;
    std::string err;
    for (size_t n = 8; n <= file.size(); ++n) {
      if (parse_trace(file.substr(0, n), &t, &err)) {
        header_end = n;
        break;
      }
    }
  }
  ASSERT_GT(header_end, 8u);
  size_t previous_events = 0;
  for (size_t n = 0; n <= file.size(); ++n) {
    TraceData t;
    std::string err;
    const bool ok = parse_trace(file.substr(0, n), &t, &err);
    if (n < header_end) {
      EXPECT_FALSE(ok) << n;
      EXPECT_FALSE(err.empty());
      continue;
    }
    ASSERT_TRUE(ok) << n << ": " << err;
    EXPECT_EQ(t.truncated, n != t.bytes_used) << n;
    EXPECT_LE(t.bytes_used, n);
    // Events come in whole chunks, in order; a longer prefix never loses any. (Frees whose
    // allocation is cut off cannot happen: a prefix is a prefix of time.)
    EXPECT_GE(t.events.size(), previous_events) << n;
    previous_events = t.events.size();
    for (size_t i = 0; i < t.events.size(); ++i)
      if (t.events[i].kind != events[i].kind || t.events[i].t_ns != events[i].t_ns) {
        ADD_FAILURE() << "prefix " << n << " event " << i << " differs";
        break;
      }
  }
  EXPECT_EQ(previous_events, events.size());
}

TEST(TraceReader, ATraceWithNeitherEventsNorAnEndHoldsNothingToRead) {
  // `head -c 3000 run.trace` (cut before its first events chunk) read as a run that allocated
  // nothing: every command printed empty tables and exited 0. Such a trace is refused by name; a
  // crashed run's trace (events, no end) and a run that allocated nothing (an end, no events) are
  // not.
  const std::string file = build_trace(sample_events(200, 3), 20, true);
  size_t first_events = 0;  // where the first events chunk begins
  for (size_t pos = sizeof(kFileMagic); pos + kChunkHeaderSize <= file.size();) {
    ChunkHeader ch;
    ASSERT_TRUE(parse_chunk_header(reinterpret_cast<const uint8_t*>(file.data()) + pos, &ch));
    if (ch.type == ChunkType::kEvents) {
      first_events = pos;
      break;
    }
    pos += kChunkHeaderSize + ch.length;
  }
  ASSERT_GT(first_events, 0u);
  for (size_t n = 0; n <= file.size(); ++n) {
    TraceData t;
    std::string err;
    if (!parse_trace(file.substr(0, n), &t, &err)) {
      // Cut inside the header: a trace cut short, not "not a gpushim trace".
      if (n >= sizeof(kFileMagic)) {
        EXPECT_NE(err.find("a gpushim trace cut short"), std::string::npos) << n << ": " << err;
      }
      continue;
    }
    const std::string why = t.nothing_to_read();
    if (n <= first_events + kChunkHeaderSize) {
      EXPECT_EQ(why.rfind("no events to read: ", 0), 0u) << n << ": " << why;
      // Torn: said so; cut at a chunk boundary: a recording that stopped after its header.
      EXPECT_EQ(why.find("the trace is cut short (") != std::string::npos, t.truncated) << n << ": " << why;
      EXPECT_EQ(why.find("the trace ends after its header") != std::string::npos, !t.truncated) << n << ": " << why;
      EXPECT_EQ(why.find('\n'), std::string::npos);
    } else if (!t.events.empty()) {
      EXPECT_EQ(why, "") << n;
    }
  }
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(build_trace({}, 20, true), &t, &err)) << err;
  EXPECT_EQ(t.nothing_to_read(), "") << "an end record and no events: a run that allocated nothing";
  ASSERT_TRUE(parse_trace(build_trace(sample_events(30, 3), 20, false), &t, &err)) << err;
  EXPECT_FALSE(t.end.has_value());
  EXPECT_EQ(t.nothing_to_read(), "") << "events and no end record: a crashed run";
}

TEST(TraceReader, CorruptionStopsReadingCleanly) {
  const auto events = sample_events(2000, 4);
  const std::string file = build_trace(events, 100, true);
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bad = file;
    const size_t at = 8 + rng() % (bad.size() - 8);
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    TraceData t;
    std::string err;
    if (!parse_trace(bad, &t, &err)) {
      EXPECT_FALSE(err.empty());
      continue;  // the header chunk itself was hit
    }
    EXPECT_TRUE(t.truncated) << "flip at " << at << " went unnoticed";
    EXPECT_LE(t.bytes_used, at);
    EXPECT_LE(t.events.size(), events.size());
  }
}

TEST(TraceReader, PoolOrderBeatsTimestampsOfConcurrentOperations) {
  // Thread A freed block X (pool operation 7) and thread B then got X (operation 8), but B read
  // the clock first. The reader must follow the pool's numbers for device 0's pool events, leave
  // device 1's and the forwarded events where their times put them, and keep times monotone.
  auto pooled = [](EventKind kind, uint64_t t, uint64_t addr, uint64_t seq, int16_t device = 0) {
    TraceEvent e;
    e.kind = kind;
    e.t_ns = t;
    e.addr = addr;
    e.size = e.requested = 512;
    e.seq = seq;
    e.device = device;
    e.flags = kFlagSequenced;
    return e;
  };
  TraceEvent forwarded;
  forwarded.kind = EventKind::kAlloc;
  forwarded.t_ns = 1005;
  forwarded.addr = 0x9000;
  forwarded.size = forwarded.requested = 4096;
  forwarded.flags = kFlagForwarded;
  const std::vector<TraceEvent> written = {
      pooled(EventKind::kAlloc, 1000, 0x1000, 6), pooled(EventKind::kAlloc, 1001, 0x5000, 3, 1), forwarded,
      pooled(EventKind::kAlloc, 1010, 0x1000 /* X again */, 8), pooled(EventKind::kFree, 1020, 0x1000, 7),
      pooled(EventKind::kFree, 1030, 0x5000, 4, 1)};
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(build_trace(written, 100, true), &t, &err)) << err;
  ASSERT_EQ(t.events.size(), written.size());
  EXPECT_EQ(t.unmatched_frees, 0u);
  EXPECT_EQ(t.implied_frees, 0u);
  std::vector<uint64_t> seqs;
  for (const TraceEvent& e : t.events) seqs.push_back(e.seq);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{6, 3, 0, 7, 8, 4}));
  EXPECT_EQ(t.events[3].kind, EventKind::kFree);
  EXPECT_EQ(t.events[4].kind, EventKind::kAlloc);
  for (size_t i = 1; i < t.events.size(); ++i) EXPECT_LE(t.events[i - 1].t_ns, t.events[i].t_ns);
}

TEST(TraceReader, GarbageIsNotATrace) {
  TraceData t;
  std::string err;
  EXPECT_FALSE(parse_trace("", &t, &err));
  EXPECT_FALSE(parse_trace("{\"schema\":\"gpushim-report/1\"}", &t, &err));
  EXPECT_NE(err.find("not a gpushim trace"), std::string::npos);
  std::string only_magic(kFileMagic, sizeof(kFileMagic));
  EXPECT_FALSE(parse_trace(only_magic, &t, &err));
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::string junk = only_magic;
    const size_t n = rng() % 200;
    for (size_t k = 0; k < n; ++k) junk.push_back(static_cast<char>(rng()));
    parse_trace(junk, &t, &err);  // must not crash, whatever it returns
  }
}

TEST(TraceReader, RefusesANewerMajorVersion) {
  std::string f(kFileMagic, sizeof(kFileMagic));
  std::string header;
  put_varint(&header, kVersionMajor + 1);
  put_varint(&header, 0);
  append_chunk(&f, ChunkType::kHeader, header);
  TraceData t;
  std::string err;
  EXPECT_FALSE(parse_trace(f, &t, &err));
  EXPECT_NE(err.find("version"), std::string::npos) << err;
}

TEST(TraceReader, SkipsChunkTypesItDoesNotKnow) {
  const auto events = sample_events(100, 6);
  std::string file = build_trace(events, 100, false);
  append_chunk(&file, static_cast<ChunkType>(200), "from a newer writer");
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(file, &t, &err)) << err;
  EXPECT_FALSE(t.truncated);
  EXPECT_EQ(t.events.size(), events.size());
  EXPECT_FALSE(t.end.has_value());
}

// A newer minor version adds event kinds; this reader stops at the first chunk holding one, as
// docs/trace-format.md says. The note said "the trace is cut short", blaming damage, where the
// remedy is a newer gpushim-analyze.
// A free the shim dropped (its ring full) left its allocation live in every reading of the trace,
// so the next allocation at that address was counted on top of it: a program that held nothing
// at exit summed to a leak of every block whose free was lost. The reader ends it where its
// address is handed out again.
TEST(TraceReader, AnAddressHandedOutAgainEndsTheAllocationWhoseFreeWasDropped) {
  auto event = [](EventKind kind, uint64_t t, uint64_t addr, uint64_t size, uint32_t stack) {
    TraceEvent e;
    e.kind = kind;
    e.t_ns = t;
    e.addr = addr;
    e.size = e.requested = size;
    e.stack = stack;
    return e;
  };
  const std::vector<TraceEvent> written = {
      event(EventKind::kAlloc, 1000, 0x1000, 512, 20),
      event(EventKind::kAlloc, 1010, 0x1000, 1024, 21),  // the free between them was dropped
      event(EventKind::kFree, 1020, 0x1000, 0, 0),
  };
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(build_trace(written, 100, true), &t, &err)) << err;
  EXPECT_EQ(t.implied_frees, 1u);
  EXPECT_EQ(t.unmatched_frees, 0u);
  ASSERT_EQ(t.events.size(), 4u);
  EXPECT_EQ(t.events[1].kind, EventKind::kFree);  // the first allocation, ended at the second's time
  EXPECT_EQ(t.events[1].t_ns, 1010u);
  EXPECT_EQ(t.events[1].size, 512u);
  EXPECT_EQ(t.events[1].stack, 20u);
  EXPECT_EQ(t.events[3].size, 1024u);  // the real free is the second's
  EXPECT_EQ(t.events[3].stack, 21u);
}

// A file under the input size limit could still hold more events than memory: each takes 56 bytes
// decoded, ten to forty times its bytes in the file (a 100 MB trace of small events took 3.7 GB),
// and the kernel's OOM killer, not a line, ended the reader. Reading stops at the budget instead,
// as at damage: the notes say so, and what was read is summarized.
TEST(TraceReader, StopsAtTheEventBudgetAndSaysSo) {
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(build_trace(sample_events(10, 1), 3, true), &t, &err, /*max_events=*/4)) << err;
  EXPECT_TRUE(t.truncated);
  EXPECT_NE(t.stop_reason.find("left unread: their memory would pass the input budget"), std::string::npos)
      << t.stop_reason;
  TraceData whole;
  ASSERT_TRUE(parse_trace(build_trace(sample_events(10, 1), 3, true), &whole, &err)) << err;
  EXPECT_FALSE(whole.truncated);
  EXPECT_LT(t.events.size() + t.checkpoints.size(), whole.events.size() + whole.checkpoints.size());
}

TEST(TraceReader, AChunkOfANewerMinorVersionIsNotCalledDamage) {
  for (const uint32_t minor : {kVersionMinor, kVersionMinor + 1}) {
    SCOPED_TRACE(minor);
    std::string f(kFileMagic, sizeof(kFileMagic));
    HeaderInfo h;
    h.exe = "/opt/prog";
    std::string header = encode_header(h);
    ASSERT_EQ(static_cast<uint8_t>(header[1]), kVersionMinor);  // varint major, varint minor
    header[1] = static_cast<char>(minor);
    append_chunk(&f, ChunkType::kHeader, header);
    std::string events;
    put_varint(&events, 0);  // base_ns
    put_varint(&events, 1);  // one event, of a kind this reader does not know
    events += static_cast<char>(kEventKindCount);
    put_varint(&events, 0);
    append_chunk(&f, ChunkType::kEvents, events);
    TraceData t;
    std::string err;
    ASSERT_TRUE(parse_trace(f, &t, &err)) << err;
    EXPECT_TRUE(t.truncated);
    analysis::RunView v;
    analysis::run_from_trace(t, "t.trace", &v);
    ASSERT_FALSE(v.notes.empty());
    const std::string note = v.notes[0];
    if (minor == kVersionMinor) {
      EXPECT_EQ(note.rfind("the trace is cut short (malformed chunk of type 5 at byte ", 0), 0u) << note;
    } else {
      EXPECT_EQ(note.rfind("the trace is format 1." + std::to_string(minor) + ", newer than this tool reads (1." +
                               std::to_string(kVersionMinor) + ")", 0),
                0u)
          << note;
      EXPECT_NE(note.find("a newer gpushim-analyze reads on"), std::string::npos) << note;
    }
  }
}

// Streams one forget_streams retired: each its own event, carrying the handle and how many went
// together, numbered in the pool's order between the operations around them.
TEST(TraceReader, StreamRetirementsReadBackInThePoolsOrder) {
  std::vector<TraceEvent> events;
  uint64_t now = 1'000'000'100, seq = 0;
  auto add = [&](EventKind kind, uint64_t stream, uint64_t size) {
    TraceEvent e;
    e.t_ns = now += 10;
    e.kind = kind;
    e.stream = stream;
    e.size = e.requested = size;
    e.addr = kind == EventKind::kStreamRetired ? 0 : 0x7f0000000000ull;
    e.flags = kFlagSequenced | (stream ? kFlagStreamOrdered : 0);
    if (kind == EventKind::kStreamRetired) e.flags = kFlagSequenced;
    e.seq = ++seq;
    events.push_back(e);
  };
  add(EventKind::kAlloc, 0x5000, 4096);
  add(EventKind::kStreamRetired, 0x5000, 2);
  add(EventKind::kStreamRetired, 0x6000, 2);
  add(EventKind::kFree, 0x7000, 4096);
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(build_trace(events, 3, false), &t, &err)) << err;
  EXPECT_FALSE(t.truncated) << t.stop_reason;
  EXPECT_EQ(t.version_minor, kVersionMinor);
  ASSERT_EQ(t.events.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind != EventKind::kStreamRetired) continue;
    expect_same_event(t.events[i], events[i], i);
    EXPECT_EQ(t.events[i].seq, events[i].seq);
  }
}

// A reuse moment the format does not define is damage, not something to replay.
TEST(TraceReader, RefusesAReuseMomentItDoesNotKnow) {
  TraceEvent e;
  e.t_ns = 1'000'000'001;
  e.kind = EventKind::kReuse;
  e.requested = kReuseMomentCount - 1;
  e.size = 4;
  const std::string good = build_trace({e}, 10, false);
  e.requested = kReuseMomentCount;
  const std::string bad = build_trace({e}, 10, false);
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(good, &t, &err)) << err;
  EXPECT_FALSE(t.truncated);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].kind, EventKind::kReuse);
  TraceData u;
  ASSERT_TRUE(parse_trace(bad, &u, &err)) << err;
  EXPECT_TRUE(u.truncated);
  EXPECT_TRUE(u.events.empty());
}

}  // namespace
}  // namespace gpushim::trace
