#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "report/report_writer.h"

namespace gpushim {
namespace {

ReportData SampleReport() {
  ReportData r;
  r.pid = 4242;
  r.exe = "/opt/bin/prog";
  r.host = "node-7";
  r.rank = "3";
  r.policy = "caching";
  r.reason = "exit";
  r.wall_time_s = 1718000000.125;
  r.duration_s = 12.5;
  r.stack_depth = 32;
  DeviceReport d;
  d.device = 1;
  d.live_bytes = 12ull << 20;
  d.live_count = 3;
  d.peak_bytes = 40ull << 20;
  d.peak_allocated_at_s = 1.2;
  d.peak_reserved_bytes = 64ull << 20;
  d.total_allocs = 10;
  d.total_frees = 7;
  d.failed_allocs = 0;
  d.capacity_bytes = 80ull << 30;
  d.limit_bytes = UINT64_MAX;
  d.pool.reserved_bytes = 64ull << 20;
  d.pool.cached_free_bytes = 20ull << 20;
  d.pool.ooms = 2;
  d.pool.mapped_bytes = 12345;
  r.devices.push_back(d);
  OtherMemoryReport o;
  o.kind = "managed";
  o.live_bytes = 4096;
  o.live_count = 1;
  o.peak_bytes = 8192;
  o.total_allocs = 2;
  o.total_frees = 1;
  r.other_memory.push_back(o);
  SiteReport s;
  s.device = 1;
  s.live_bytes = 8ull << 20;
  s.live_count = 2;
  s.stack_id = 17;
  FrameInfo py;
  py.function = "train_step";
  py.file = "train.py";
  py.line = 42;
  py.python = true;
  FrameInfo nat;
  nat.function = "leak_a()";
  nat.file = "/src/prog.cpp";
  nat.line = 12;
  nat.module = "/opt/bin/prog";
  nat.address = 0x7fffffffffffffffull;
  nat.module_offset = 0x1234;
  s.frames = {nat, py};
  r.sites.push_back(s);
  SiteReport empty_site;
  empty_site.kind = "host";
  r.sites.push_back(empty_site);
  r.timeline.push_back({0.5, 1, 1ull << 20, 2ull << 20});
  r.timeline.push_back({1.0, 1, 3ull << 20, 4ull << 20});
  OomReport oom;
  oom.t_s = 2.5;
  oom.device = 1;
  oom.requested = 2ull << 30;
  oom.capacity = 80ull << 30;
  oom.limit = 16ull << 30;
  oom.device_free = 100ull << 20;
  oom.allocated = 10ull << 30;
  oom.reserved = 12ull << 30;
  oom.cached_free = 2ull << 30;
  oom.largest_free_block = 512ull << 20;
  oom.advice = "try \"expandable\" segments";
  oom.frames = {nat};
  oom.top_sites = {s};
  r.ooms.push_back(oom);
  r.invalid_frees = 1;
  r.distinct_stacks = 5;
  r.shim_host_bytes = 65536;
  return r;
}

std::string WriteTemp(const std::string& content, const char* suffix) {
  std::string path = std::string("/tmp/gpushim_json_test_XXXXXX") + suffix;
  const int fd = mkstemps(path.data(), static_cast<int>(strlen(suffix)));
  if (fd < 0) return "";
  const bool ok = write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  close(fd);
  if (!ok) unlink(path.c_str());
  return ok ? path : "";
}

// Runs python3 on `json` with a script that sees it as `doc` (read strictly: UTF-8, no
// NaN/Infinity) and returns what the script prints. False if the document does not parse.
bool RunPython(const std::string& json, const std::string& script, std::string* output) {
  const std::string doc = WriteTemp(json, ".json");
  const std::string prog = WriteTemp(
      "import json, sys\n"
      "def bad(c): raise ValueError('constant ' + c)\n"
      "doc = json.load(open(sys.argv[1], encoding='utf-8', errors='strict'), parse_constant=bad)\n" +
          script + "\n",
      ".py");
  if (doc.empty() || prog.empty()) return false;
  FILE* p = popen(("python3 " + prog + " " + doc + " 2>&1").c_str(), "r");
  output->clear();
  int rc = -1;
  if (p != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
    rc = pclose(p);
  }
  unlink(doc.c_str());
  unlink(prog.c_str());
  return rc == 0;
}

bool HavePython() { return system("python3 -c 'pass' >/dev/null 2>&1") == 0; }

TEST(ReportJson, FieldsPresentAndOrdered) {
  const std::string j = report_to_json(SampleReport());
  const char* keys[] = {"\"schema\":\"gpushim-report/1\"", "\"pid\":4242", "\"exe\":", "\"host\":", "\"rank\":\"3\"",
                        "\"policy\":\"caching\"", "\"reason\":\"exit\"", "\"wall_time_s\":", "\"duration_s\":12.5",
                        "\"stack_depth\":32", "\"devices\":[", "\"other_memory\":[", "\"invalid_frees\":1",
                        "\"distinct_stacks\":5", "\"shim_host_bytes\":65536", "\"ooms\":[", "\"sites\":[",
                        "\"timeline\":["};
  size_t at = 0;
  for (const char* k : keys) {
    const size_t pos = j.find(k, at);
    ASSERT_NE(pos, std::string::npos) << k << " missing or out of order in\n" << j;
    at = pos;
  }
  EXPECT_NE(j.find("\"pool\":{\"requested_bytes\":0"), std::string::npos);
  EXPECT_NE(j.find("\"kind\":\"python\""), std::string::npos);
  EXPECT_NE(j.find("\"kind\":\"native\""), std::string::npos);
  EXPECT_NE(j.find("\"limit_bytes\":18446744073709551615"), std::string::npos) << "uint64 max must be exact";
  EXPECT_NE(j.find("\"address\":9223372036854775807"), std::string::npos);
  EXPECT_EQ(j.back(), '\n');
}

TEST(ReportJson, ParsesBackWithExactValues) {
  ASSERT_TRUE(HavePython()) << "python3 is a build dependency (scripts/setup)";
  const std::string j = report_to_json(SampleReport());
  std::string out;
  ASSERT_TRUE(RunPython(j,
                        "d = doc['devices'][0]; s = doc['sites'][0]; f = s['frames']\n"
                        "print(doc['schema'], doc['pid'], doc['rank'], d['device'], d['limit_bytes'],\n"
                        "      d['peak_allocated_at_s'], d['pool']['ooms'], d['pool']['mapped_bytes'],\n"
                        "      doc['other_memory'][0]['kind'], s['stack_id'], f[0]['address'], f[0]['line'],\n"
                        "      f[0]['kind'], f[1]['kind'], f[1]['function'], len(doc['sites'][1]['frames']),\n"
                        "      doc['wall_time_s'], list(d['pool'].keys()) == ['requested_bytes',\n"
                        "      'peak_requested_bytes', 'reserved_bytes', 'peak_reserved_bytes', 'cached_free_bytes',\n"
                        "      'quarantined_bytes', 'largest_free_block', 'segment_allocs', 'segment_frees',\n"
                        "      'alloc_retries', 'ooms', 'reuse_syncs', 'reuse_waits', 'map_calls', 'unmap_calls', 'mapped_bytes'],\n"
                        "      list(f[0].keys()))\n"
                        "o = doc['ooms'][0]; t = doc['timeline']\n"
                        "print(o['t_s'], o['device'], o['requested'], o['limit'], o['advice'], o['frames'][0]['function'],\n"
                        "      o['top_sites'][0]['stack_id'], len(o['top_sites'][0]['frames']), len(t), t[1]['t_s'],\n"
                        "      t[1]['allocated'], t[1]['reserved'], t[0]['device'])",
                        &out))
      << out << "\n" << j;
  EXPECT_EQ(out,
            "gpushim-report/1 4242 3 1 18446744073709551615 1.2 2 12345 managed 17 9223372036854775807 12 native "
            "python train_step 0 1718000000.125 True ['function', 'file', 'line', 'module', 'address', "
            "'module_offset', 'kind']\n"
            "2.5 1 2147483648 17179869184 try \"expandable\" segments leak_a() 17 2 2 1.0 3145728 4194304 1\n");
}

TEST(ReportJson, EscapingKeepsDocumentValid) {
  ReportData r = SampleReport();
  std::string nasty = "q\"b\\s/\n\r\t\b\f";
  for (int c = 0; c < 0x20; ++c) nasty += static_cast<char>(c);
  nasty += '\x7f';
  nasty += "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";      // valid 2-, 3- and 4-byte UTF-8
  nasty += "|\xff|\xc3|\xe2\x82|\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80|";  // invalid: replaced
  r.exe = nasty;
  r.sites[0].frames[0].function = nasty;
  r.sites[0].frames[1].file = std::string("a\0b", 3);
  const std::string j = report_to_json(r);
  EXPECT_NE(j.find("\\u0000"), std::string::npos);
  EXPECT_NE(j.find("\\u007f"), std::string::npos);
  EXPECT_NE(j.find("\\\"b\\\\s/\\n\\r\\t\\b\\f"), std::string::npos);
  EXPECT_NE(j.find("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string::npos) << "valid UTF-8 kept as is";
  EXPECT_NE(j.find("|\\ufffd|\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd\\ufffd|"),
            std::string::npos)
      << j;
  ASSERT_TRUE(HavePython()) << "python3 is a build dependency (scripts/setup)";
  std::string out;
  ASSERT_TRUE(RunPython(j, "print(ascii(doc['exe']), ascii(doc['sites'][0]['frames'][1]['file']))", &out)) << out;
  std::string expected_exe = "'q\"b\\\\s/\\n\\r\\t\\x08\\x0c";
  for (int c = 0; c < 0x20; ++c) {
    static const char* kNamed[] = {"\\x00", "\\x01", "\\x02", "\\x03", "\\x04", "\\x05", "\\x06", "\\x07",
                                   "\\x08", "\\t",   "\\n",   "\\x0b", "\\x0c", "\\r",   "\\x0e", "\\x0f",
                                   "\\x10", "\\x11", "\\x12", "\\x13", "\\x14", "\\x15", "\\x16", "\\x17",
                                   "\\x18", "\\x19", "\\x1a", "\\x1b", "\\x1c", "\\x1d", "\\x1e", "\\x1f"};
    expected_exe += kNamed[c];
  }
  expected_exe +=
      "\\x7fcaf\\xe9 \\u20ac \\U0001f600|\\ufffd|\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|"
      "\\ufffd\\ufffd\\ufffd\\ufffd|'";
  EXPECT_EQ(out, expected_exe + " 'a\\x00b'\n");
}

TEST(ReportJson, NonFiniteDoublesAreNull) {
  ReportData r = SampleReport();
  r.wall_time_s = std::numeric_limits<double>::quiet_NaN();
  r.duration_s = std::numeric_limits<double>::infinity();
  r.devices[0].peak_allocated_at_s = -std::numeric_limits<double>::infinity();
  const std::string j = report_to_json(r);
  EXPECT_NE(j.find("\"wall_time_s\":null"), std::string::npos);
  EXPECT_NE(j.find("\"duration_s\":null"), std::string::npos);
  EXPECT_NE(j.find("\"peak_allocated_at_s\":null"), std::string::npos);
  EXPECT_EQ(j.find("nan"), std::string::npos);
  EXPECT_EQ(j.find("inf"), std::string::npos);
}

TEST(ReportJson, DoublesRoundTrip) {
  ReportData r = SampleReport();
  r.duration_s = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  r.wall_time_s = 3.0;
  r.devices[0].peak_allocated_at_s = 1e-7;
  const std::string j = report_to_json(r);
  EXPECT_NE(j.find("\"duration_s\":0.30000000000000004"), std::string::npos) << j;
  EXPECT_NE(j.find("\"wall_time_s\":3.0"), std::string::npos) << j;
  ASSERT_TRUE(HavePython()) << "python3 is a build dependency (scripts/setup)";
  std::string out;
  ASSERT_TRUE(RunPython(j,
                        "print(doc['duration_s'] == 0.1 + 0.2, doc['devices'][0]['peak_allocated_at_s'] == 1e-7,"
                        " type(doc['wall_time_s']).__name__)",
                        &out))
      << out;
  EXPECT_EQ(out, "True True float\n");
}

TEST(ReportJson, EmptyReportIsValid) {
  ReportData r;
  const std::string j = report_to_json(r);
  EXPECT_NE(j.find("\"devices\":[]"), std::string::npos) << j;
  EXPECT_NE(j.find("\"sites\":[]"), std::string::npos) << j;
  ASSERT_TRUE(HavePython()) << "python3 is a build dependency (scripts/setup)";
  std::string out;
  ASSERT_TRUE(RunPython(j, "print(doc['schema'], doc['reason'], doc['sites'])", &out)) << out;
  EXPECT_EQ(out, "gpushim-report/1 exit []\n");
}

// The summary is for people, but its shape is what users and the e2e tests grep for.
TEST(ReportSummary, Lines) {
  ReportData r = SampleReport();
  r.exe = "./prog";
  r.pid = 123;
  FrameInfo shim;
  shim.function = "cudaMalloc";
  shim.module = "/x/lib/libgpushim.so";
  FrameInfo cudart;
  cudart.function = "cudaMalloc";
  cudart.module = "/usr/local/cuda/lib64/libcudart.so.13";
  FrameInfo unknown;
  unknown.address = 0x1000;
  unknown.module = "/lib/libfoo.so";
  unknown.module_offset = 0x10;
  r.sites[0].frames.insert(r.sites[0].frames.begin(), {shim, cudart});
  r.sites[0].frames.push_back(unknown);
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  ASSERT_NE(mem, nullptr);
  write_summary(r, "/tmp/gpushim.prog.123.json", 10, mem);
  fclose(mem);
  const std::string s(buf, len);
  free(buf);
  EXPECT_NE(s.find("gpushim: report for ./prog (pid 123, policy caching)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("gpushim: device 1: live 12.0 MiB in 3 allocations, peak allocated 40.0 MiB at 1.20 s, peak "
                   "reserved 64.0 MiB, 10 allocs, 7 frees, 0 failed"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("gpushim:   #1 8.0 MiB in 2 allocations (device 1)\n"
                   "gpushim:       at leak_a() prog.cpp:12 (prog)\n"
                   "gpushim:       at train_step (train.py:42)\n"
                   "gpushim:       at 0x1000 (libfoo.so+0x10)\n"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("libcudart"), std::string::npos) << "runtime frames are not shown";
  EXPECT_NE(s.find("gpushim:   #2 0 B in 0 allocations (host memory)\ngpushim:       (no stack captured)\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("gpushim: out of memory on device 1 at 2.50 s: requested 2.0 GiB; allocated 10.0 GiB, reserved "
                   "12.0 GiB (cached 2.0 GiB, largest free block 512.0 MiB), device free 100.0 MiB of 80.0 GiB, "
                   "cap 16.0 GiB\ngpushim:       at leak_a() prog.cpp:12 (prog)\n"
                   "gpushim:   advice: try \"expandable\" segments\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("gpushim: report written to /tmp/gpushim.prog.123.json\n"), std::string::npos);
  // Every line carries the prefix.
  size_t start = 0;
  while (start < s.size()) {
    EXPECT_EQ(s.compare(start, 9, "gpushim: "), 0) << s.substr(start);
    start = s.find('\n', start) + 1;
    ASSERT_NE(start, 0u) << "unterminated last line";
  }
}

TEST(ReportSummary, LimitsSites) {
  ReportData r = SampleReport();
  for (int i = 0; i < 5; ++i) r.sites.push_back(r.sites[0]);
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  write_summary(r, "", 2, mem);
  fclose(mem);
  const std::string s(buf, len);
  free(buf);
  EXPECT_NE(s.find("#2 "), std::string::npos);
  EXPECT_EQ(s.find("#3 "), std::string::npos);
  EXPECT_NE(s.find("... 5 sites more holding 40.0 MiB"), std::string::npos) << s;
  EXPECT_EQ(s.find("report written"), std::string::npos);
}

}  // namespace
}  // namespace gpushim
