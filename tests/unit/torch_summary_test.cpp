// `summary --format torch` is PyTorch's memory_summary() table: the renderer against PyTorch's own
// output for the same statistics (tests/unit/data/torch_memory_summary.txt, made by PyTorch's code:
// gen_torch_memory_summary.py), and the trace tally's "Non-releasable" rows on a known layout.
#include "torch_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "accounting/memory_kind.h"
#include "json.h"

namespace gpushim::analysis {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TorchStat stat_of(const JsonValue& flat, const std::string& prefix) {
  TorchStat s;
  uint64_t v = 0;
  EXPECT_TRUE(flat.get(prefix + "current")->to_u64(&v)) << prefix;
  s.current = v;
  EXPECT_TRUE(flat.get(prefix + "peak")->to_u64(&v)) << prefix;
  s.peak = v;
  EXPECT_TRUE(flat.get(prefix + "allocated")->to_u64(&v)) << prefix;
  s.allocated = v;
  EXPECT_TRUE(flat.get(prefix + "freed")->to_u64(&v)) << prefix;
  s.freed = v;
  return s;
}

TEST(TorchSummary, TableIsPyTorchsOwnForTheSameStatistics) {
  const std::string dir = GPUSHIM_SOURCE_DIR "/tests/unit/data/";
  JsonValue flat;
  std::string err;
  ASSERT_TRUE(parse_json(read(dir + "torch_memory_summary.json"), &flat, &err)) << err;
  // memory_stats()'s keys, in memory_summary()'s order.
  const char* keys[kTorchMetrics] = {"allocated_bytes", "active_bytes", "requested_bytes",
                                     "reserved_bytes",  "inactive_split_bytes", "allocation",
                                     "active",          "segment",      "inactive_split"};
  const char* pools[kTorchPools] = {"all", "large_pool", "small_pool"};
  TorchDeviceStats s;
  s.device = 0;
  for (int m = 0; m < kTorchMetrics; ++m)
    for (int p = 0; p < kTorchPools; ++p) s.stats[m][p] = stat_of(flat, std::string(keys[m]) + "." + pools[p] + ".");
  s.oversize_allocations = stat_of(flat, "oversize_allocations.");
  s.oversize_segments = stat_of(flat, "oversize_segments.");
  uint64_t v = 0;
  ASSERT_TRUE(flat.get("num_ooms")->to_u64(&v));
  s.num_ooms = v;
  ASSERT_TRUE(flat.get("num_alloc_retries")->to_u64(&v));
  s.num_alloc_retries = v;

  std::string golden = read(dir + "torch_memory_summary.txt");
  ASSERT_FALSE(golden.empty());
  // The one difference: whose summary it is (the same width).
  const size_t title = golden.find("PyTorch CUDA memory summary");
  ASSERT_NE(title, std::string::npos);
  golden.replace(title, 7, "gpushim");
  EXPECT_EQ(render_torch_table(s), golden);
}

TEST(TorchSummary, UnknownCellsOfAReportSayNa) {
  TorchDeviceStats s;
  s.stats[kAllocatedBytes][kAllPools] = TorchStat{1 << 20, 2 << 20, {}, {}};
  const std::string t = render_torch_table(s);
  EXPECT_NE(t.find("| Allocated memory      |   1024 KiB |   2048 KiB |    n/a     |    n/a     |\n"), std::string::npos) << t;
  EXPECT_NE(t.find("CUDA OOMs: n/a          |        cudaMalloc retries: n/a       |"), std::string::npos) << t;
  std::istringstream lines(t);
  for (std::string l; std::getline(lines, l);) EXPECT_EQ(l.size(), 77u) << l;
}

TEST(TorchSummary, AShimRowLongerThanTheTableWrapsAndKeepsEveryWord) {
  // An H200's "Unaccounted" row (2026-11-29): cut off at the border, "not in memory held" lost.
  const std::string value = "5.0 GiB at 0.26 s, next to the peak in time, not in memory held";
  const std::string t = torch_table_extra_row("Unaccounted", value);
  EXPECT_EQ(t,
            "| Unaccounted           | 5.0 GiB at 0.26 s, next to the peak in time, not  |\n"
            "|                       | in memory held                                    |\n");
  EXPECT_EQ(torch_table_extra_row("Duration", "0.28 s"), "| Duration              | 0.28 s                                            |\n");
  // A word longer than the column is split, never dropped.
  const std::string word(60, 'x');
  const std::string w = torch_table_extra_row("Long", word);
  EXPECT_EQ(std::count(w.begin(), w.end(), 'x'), 60);
  std::istringstream lines(w);
  for (std::string l; std::getline(lines, l);) EXPECT_EQ(l.size(), 77u) << l;
}

trace::TraceEvent event(EventKind kind, uint64_t addr, uint64_t size) {
  trace::TraceEvent e;
  e.kind = kind;
  e.addr = addr;
  e.size = size;
  e.requested = size;
  e.flags = static_cast<uint8_t>(MemoryKind::kDevice);
  return e;
}

TEST(TorchSummary, NonReleasableIsTheFreePartOfSegmentsStillInUse) {
  constexpr uint64_t MiB = 1 << 20, base = 0x10000000;
  TraceData t;
  // One 4 MiB segment (large pool); A at its start, B 2 MiB in; free A, then B.
  t.events = {event(EventKind::kSegmentAlloc, base, 4 * MiB), event(EventKind::kAlloc, base, MiB),
              event(EventKind::kAlloc, base + 2 * MiB, MiB), event(EventKind::kFree, base, MiB),
              event(EventKind::kFree, base + 2 * MiB, MiB)};
  RunView run;
  run.meta.devices.push_back(DeviceReport{});
  const std::vector<TorchDeviceStats> all = torch_stats(run, &t);
  ASSERT_EQ(all.size(), 1u);
  const auto& st = all[0].stats;
  // After A: 3 MiB in one piece; after B: 2 MiB in two; after A's free: 3 MiB in two; then the
  // wholly free segment is releasable: nothing.
  const TorchStat bytes = st[kInactiveSplitBytes][kLargePool], pieces = st[kInactiveSplit][kLargePool];
  EXPECT_EQ(bytes.current, 0u);
  EXPECT_EQ(bytes.peak, 3 * MiB);
  EXPECT_EQ(bytes.allocated, 4 * MiB);
  EXPECT_EQ(bytes.freed, 4 * MiB);
  EXPECT_EQ(pieces.current, 0u);
  EXPECT_EQ(pieces.peak, 2u);
  EXPECT_EQ(pieces.allocated, 2u);
  EXPECT_EQ(pieces.freed, 2u);
  EXPECT_EQ(st[kInactiveSplitBytes][kSmallPool].peak, 0u);
  // Blocks of exactly 1 MiB are PyTorch's small pool; the 4 MiB segment its large one.
  EXPECT_EQ(st[kAllocatedBytes][kSmallPool].peak, 2 * MiB);
  EXPECT_EQ(st[kAllocatedBytes][kLargePool].peak, 0u);
  EXPECT_EQ(st[kReservedBytes][kLargePool].current, 4 * MiB);
  EXPECT_EQ(st[kSegment][kAllPools].current, 1u);
  EXPECT_EQ(st[kAllocation][kAllPools].peak, 2u);
  EXPECT_EQ(st[kAllocation][kAllPools].freed, 2u);
}

}  // namespace
}  // namespace gpushim::analysis
