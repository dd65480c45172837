// The analysis tool's readers: JSON, and reports written by the shim's own writer.
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <string>

#include "json.h"
#include "report/report_writer.h"
#include "report_reader.h"
#include "run_view.h"

namespace gpushim::analysis {
namespace {

TEST(Json, ParsesDocumentsAndKeepsIntegersExact) {
  JsonValue v;
  std::string err;
  ASSERT_TRUE(parse_json(R"( {"a": [1, -2, 3.5e2, true, false, null], "big": 18446744073709551615,
                             "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"} )",
                         &v, &err))
      << err;
  ASSERT_TRUE(v.is_object());
  const JsonValue* a = v.get("a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->items().size(), 6u);
  int64_t i = 0;
  EXPECT_TRUE(a->items()[1].to_i64(&i));
  EXPECT_EQ(i, -2);
  uint64_t u = 0;
  EXPECT_FALSE(a->items()[1].to_u64(&u));  // negative
  EXPECT_FALSE(a->items()[2].to_u64(&u));  // not an integer
  double d = 0;
  EXPECT_TRUE(a->items()[2].to_double(&d));
  EXPECT_EQ(d, 350.0);
  EXPECT_TRUE(a->items()[3].boolean());
  EXPECT_TRUE(a->items()[5].is_null());
  ASSERT_TRUE(v.get("big")->to_u64(&u));
  EXPECT_EQ(u, UINT64_MAX);
  EXPECT_EQ(v.get("s")->str(), "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.get("missing"), nullptr);
}

TEST(Json, RejectsMalformedInputWithAPosition) {
  const char* bad[] = {"",        "{",          "[1,]",       "{\"a\" 1}", "{\"a\":1,}", "tru",
                       "01",      "1.",         "-",          "\"\\x\"",   "\"abc",      "[1] 2",
                       "{\"a\"}", "\"\x01\"",   "1e",         "[\"\\u12\"]"};
  for (const char* s : bad) {
    JsonValue v;
    std::string err;
    EXPECT_FALSE(parse_json(s, &v, &err)) << s;
    EXPECT_NE(err.find("line"), std::string::npos) << s;
  }
}

TEST(Json, ANulByteAnywhereIsRefused) {
  // nlohmann's lexer ends the input at a NUL: a report with one after its last brace was accepted
  // whole, and the fuzzer's rule (what the reader accepts, read_file's early check lets through)
  // broke on it.
  for (const std::string& s : {std::string("{\"schema\":\"gpushim-report/1\"}\0", 30),
                              std::string("{\"schema\":\"gpushim-report/1\"}\n\0junk", 35), std::string("[1,\0 2]", 7)}) {
    JsonValue v;
    std::string err;
    EXPECT_FALSE(parse_json(s, &v, &err)) << s.size();
    EXPECT_NE(err.find("NUL"), std::string::npos) << err;
  }
}

TEST(Json, DeepNestingIsRefusedNotFatal) {
  const std::string deep(100000, '[');
  JsonValue v;
  std::string err;
  EXPECT_FALSE(parse_json(deep, &v, &err));
  EXPECT_NE(err.find("deep"), std::string::npos) << err;
}

TEST(Json, BytesThatAreNotUtf8ReadAsReplacementCharacters) {
  JsonValue v;
  std::string err;
  ASSERT_TRUE(parse_json("{\"exe\": \"/t\xff\xc3\xa9x\xc3\"}", &v, &err)) << err;
  EXPECT_EQ(v.get("exe")->str(), "/t\xef\xbf\xbd\xc3\xa9x\xef\xbf\xbd");
  EXPECT_FALSE(parse_json("[1, \xff]", &v, &err));  // outside a string it is still not JSON
  EXPECT_NE(err.find("line 1"), std::string::npos) << err;
}

TEST(Json, WriterEscapesAndReplacesInvalidUtf8) {
  std::string out;
  append_json_string(&out, std::string("a\"\n\x01\xff\xc3\xa9", 7));
  EXPECT_EQ(out, "\"a\\\"\\n\\u0001\\ufffd\xc3\xa9\"");
  JsonValue v;
  std::string err;
  ASSERT_TRUE(parse_json(out, &v, &err)) << err;
}

ReportData sample_report() {
  ReportData r;
  r.pid = 99;
  r.exe = "/bin/prog";
  r.host = "h";
  r.rank = "2";
  r.policy = "caching";
  r.reason = "snapshot";
  r.wall_time_s = 1718000000.25;
  r.duration_s = 3.5;
  r.stack_depth = 16;
  DeviceReport d;
  d.device = 1;
  d.live_bytes = 5;
  d.live_count = 1;
  d.peak_bytes = UINT64_MAX;
  d.peak_allocated_at_s = 1.25;
  d.peak_reserved_bytes = 7;
  d.capacity_bytes = 80ull << 30;
  d.pool.largest_free_block = 11;
  d.pool.map_calls = 3;
  r.devices.push_back(d);
  SiteReport s;
  s.device = 1;
  s.live_bytes = 5;
  s.live_count = 1;
  s.stack_id = 33;
  FrameInfo f;
  f.function = "leak()";
  f.file = "/src/x.cpp";
  f.line = 12;
  f.module = "/bin/prog";
  f.address = 0x5555deadbeefull;
  f.module_offset = 0xbeef;
  s.frames.push_back(f);
  FrameInfo py;
  py.python = true;
  py.function = "step";
  py.file = "train.py";
  py.line = 7;
  s.frames.push_back(py);
  r.sites.push_back(s);
  r.timeline.push_back(TimelineSample{0.5, 1, 4, 8});
  OomReport o;
  o.t_s = 2.0;
  o.device = 1;
  o.requested = 1ull << 40;
  o.advice = "lower the batch size";
  o.cached_free = 9;
  o.largest_free_block = 6;
  o.injected = true;
  o.frames.push_back(f);
  o.top_sites.push_back(s);
  r.ooms.push_back(o);
  r.other_memory.push_back(OtherMemoryReport{{4096, 1, 8192, 2, 1}, "host"});
  r.invalid_frees = 4;
  r.teardown = TeardownReport{true, 1.25, 3 << 20, 3};
  return r;
}

TEST(ReportReader, ReadsBackWhatTheShimWrites) {
  const ReportData want = sample_report();
  ReportFile got;
  std::string err;
  ASSERT_TRUE(parse_report(report_to_json(want), &got, &err)) << err;
  const ReportData& r = got.report;
  EXPECT_EQ(r.pid, 99);
  EXPECT_EQ(r.rank, "2");
  EXPECT_EQ(r.reason, "snapshot");
  EXPECT_EQ(r.wall_time_s, want.wall_time_s);
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].peak_bytes, UINT64_MAX);
  EXPECT_EQ(r.devices[0].pool.largest_free_block, 11u);
  EXPECT_EQ(r.devices[0].pool.map_calls, 3u);
  ASSERT_EQ(r.sites.size(), 1u);
  EXPECT_EQ(r.sites[0].stack_id, 33u);
  ASSERT_EQ(r.sites[0].frames.size(), 2u);
  EXPECT_EQ(r.sites[0].frames[0].function, "leak()");
  EXPECT_EQ(r.sites[0].frames[0].address, 0x5555deadbeefull);
  EXPECT_TRUE(r.sites[0].frames[1].python);
  ASSERT_EQ(r.ooms.size(), 1u);
  EXPECT_EQ(r.ooms[0].requested, 1ull << 40);
  EXPECT_EQ(r.ooms[0].advice, "lower the batch size");
  EXPECT_EQ(r.ooms[0].cached_free, 9u);
  EXPECT_EQ(r.ooms[0].largest_free_block, 6u);
  EXPECT_TRUE(r.ooms[0].injected) << "GPUSHIM_FAIL's failure read back as a real one";
  EXPECT_EQ(r.ooms[0].top_sites.size(), 1u);
  ASSERT_EQ(r.timeline.size(), 1u);
  EXPECT_EQ(r.timeline[0].reserved, 8u);
  ASSERT_EQ(r.other_memory.size(), 1u);
  EXPECT_EQ(r.other_memory[0].peak_bytes, 8192u);
  EXPECT_EQ(r.invalid_frees, 4u);
  EXPECT_TRUE(r.teardown.observed);
  EXPECT_EQ(r.teardown.began_s, 1.25);
  EXPECT_EQ(r.teardown.freed_bytes, 3u << 20);
  EXPECT_EQ(r.teardown.freed_count, 3u);
  // The shim always writes a growth section now (issue 6), empty for this report.
  EXPECT_TRUE(got.has_growth);
}

TEST(ReportReader, NamesTheFieldThatIsWrong) {
  std::string json = report_to_json(sample_report());
  const std::string key = "\"live_bytes\":5";
  json.replace(json.find(key), key.size(), "\"live_bytes\":\"five\"");
  ReportFile got;
  std::string err;
  EXPECT_FALSE(parse_report(json, &got, &err));
  EXPECT_EQ(err, "devices[0].live_bytes: expected an unsigned integer");
}

// A report that lists a device twice is not one run's: merge summed both entries (387.7 MiB where
// the run held half), and every other reader took whichever came first.
TEST(ReportReader, RefusesADeviceListedTwice) {
  ReportData twice = sample_report();
  twice.devices.push_back(twice.devices[0]);
  ReportFile got;
  std::string err;
  EXPECT_FALSE(parse_report(report_to_json(twice), &got, &err));
  EXPECT_EQ(err, "devices[1]: device " + std::to_string(twice.devices[0].device) + " is listed twice (also devices[0])");
  twice.devices[1].device += 1;  // two devices: fine
  EXPECT_TRUE(parse_report(report_to_json(twice), &got, &err)) << err;
}

TEST(ReportReader, RefusesOtherDocuments) {
  ReportFile got;
  std::string err;
  EXPECT_FALSE(parse_report("[1,2]", &got, &err));
  EXPECT_FALSE(parse_report("{\"schema\":\"gpushim-report/2\",\"devices\":[],\"sites\":[]}", &got, &err));
  EXPECT_NE(err.find("unsupported"), std::string::npos) << err;
  EXPECT_FALSE(parse_report("{\"schema\":\"other/1\"}", &got, &err));
  EXPECT_FALSE(parse_report("{\"schema\":\"gpushim-report/1\",\"sites\":[]}", &got, &err));
  EXPECT_EQ(err, "devices: missing");
}

TEST(ReportReader, ReadsAGrowthSectionOfEitherShape) {
  for (const char* growth : {R"([{"device":0,"bytes_per_s":100.5,"frames":[{"function":"leaky_step"}]}])",
                             R"({"suspects":[{"device":0,"bytes_per_s":100.5,"frames":[{"function":"leaky_step"}]}]})"}) {
    const std::string doc = std::string("{\"schema\":\"gpushim-report/1\",\"devices\":[],\"sites\":[],\"growth\":") +
                            growth + "}";
    ReportFile got;
    std::string err;
    ASSERT_TRUE(parse_report(doc, &got, &err)) << err;
    EXPECT_TRUE(got.has_growth);
    ASSERT_EQ(got.growth.size(), 1u) << growth;
    EXPECT_EQ(got.growth[0].figures.at("bytes_per_s"), 100.5);
    EXPECT_EQ(got.growth[0].frames.at(0).function, "leaky_step");
  }
}

TEST(ReportReader, SecondsOutsideAnyRunAreRefusedByName) {
  // Negative or huge times went through to the exports, whose nanosecond timestamps are 64-bit
  // integers: the casts were undefined and the Perfetto trace's clock came out anywhere.
  const std::string good = report_to_json(sample_report());
  for (const auto& [key, bad, path] :
       {std::tuple<std::string, std::string, std::string>{"\"duration_s\":3.5", "\"duration_s\":-1", "duration_s"},
        {"\"duration_s\":3.5", "\"duration_s\":1e300", "duration_s"},
        {"\"t_s\":0.5", "\"t_s\":-0.5", "timeline[0].t_s"},
        {"\"peak_allocated_at_s\":1.25", "\"peak_allocated_at_s\":1e11", "devices[0].peak_allocated_at_s"}}) {
    std::string json = good;
    ASSERT_NE(json.find(key), std::string::npos) << key;
    json.replace(json.find(key), key.size(), bad);
    ReportFile got;
    std::string err;
    EXPECT_FALSE(parse_report(json, &got, &err)) << bad;
    EXPECT_EQ(err, path + ": expected seconds from 0 to 1e10");
  }
  ReportFile got;
  std::string err;
  EXPECT_TRUE(parse_report(good, &got, &err)) << err;
}

TEST(ReportReader, DamagedGrowthFiguresAreClampedNotCastOutOfRange) {
  // The growth section is read leniently; its figures are doubles turned back into integers,
  // which for -1e30 gave 8.0 EiB live.
  const std::string doc = R"({"schema":"gpushim-report/1","devices":[],"sites":[],"growth":{"suspects":[)"
                          R"({"device":0,"growth_bytes":1e30,"live_bytes":-1e30,"live_count":18446744073709551615,)"
                          R"("bytes_per_s":1e308,"bytes_per_iteration":-5,"samples":1e12,"frames":[]}]}})";
  ReportFile file;
  std::string err;
  ASSERT_TRUE(parse_report(doc, &file, &err)) << err;
  RunView run;
  ASSERT_TRUE(run_from_report(file, "r.json", &run));
  ASSERT_EQ(run.growth.size(), 1u);
  const GrowthSuspect& g = run.growth[0];
  EXPECT_EQ(g.grew_bytes, UINT64_MAX);
  EXPECT_EQ(g.live_bytes, 0u);
  EXPECT_EQ(g.live_count, UINT64_MAX);
  EXPECT_EQ(g.bytes_per_s, 1e19);
  EXPECT_EQ(g.bytes_per_iteration, 0.0);
  EXPECT_EQ(g.checkpoints, INT32_MAX);
}

TEST(ReportReader, AReportCutAnywhereIsSaidToBeCutShort) {
  // The parser's own words ("unexpected end of input", "missing closing quote", "invalid literal"
  // at some line and column, depending on where the cut fell) did not say that the file ends early.
  const std::string whole = report_to_json(sample_report());
  for (size_t n = 1; n + 1 < whole.size(); ++n) {
    ReportFile got;
    std::string err;
    const std::string cut = whole.substr(0, n);
    if (cut.find_last_not_of(" \t\r\n") == whole.find_last_not_of(" \t\r\n")) continue;  // whole but blanks
    ASSERT_FALSE(parse_report(cut, &got, &err)) << n;
    EXPECT_EQ(err.rfind("the report is cut short, after " + std::to_string(n) + (n == 1 ? " byte (" : " bytes ("), 0), 0u)
        << n << ": " << err;
  }
  // Damage that is not an early end is not called one: a stray byte after the document, a wrong one
  // inside it.
  for (const std::string& bad : {whole + " x", std::string("{\"schema\":\"gpushim-report/1\",\"devices\":[x]}")}) {
    ReportFile got;
    std::string err;
    EXPECT_FALSE(parse_report(bad, &got, &err));
    EXPECT_EQ(err.find("cut short"), std::string::npos) << err;
  }
}

TEST(ReportReader, NeverCrashesOnDamagedReports) {
  const std::string good = report_to_json(sample_report());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1500; ++i) {
    std::string bad = good;
    switch (i % 3) {
      case 0: bad.resize(rng() % bad.size()); break;
      case 1: bad[rng() % bad.size()] = static_cast<char>(rng()); break;
      default: bad.insert(rng() % bad.size(), std::string(1 + rng() % 4, "{}[]\",:0"[rng() % 8]));
    }
    ReportFile got;
    std::string err;
    if (!parse_report(bad, &got, &err)) {
      EXPECT_FALSE(err.empty());
    }
  }
}

}  // namespace
}  // namespace gpushim::analysis
