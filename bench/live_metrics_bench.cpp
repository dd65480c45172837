// Cost of one metrics-file update on the gpushim-live thread: rendering the Prometheus text, and
// replacing the file atomically (temporary file + rename). Neither runs on the program's threads;
// this says how much of a core the thread takes at a given GPUSHIM_SAMPLE_MS.
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "live/prometheus_text.h"
#include "live/replace_file.h"

namespace gpushim {
namespace {

ProcessMetrics Figures(int devices) {
  ProcessMetrics m;
  m.id = {"node-017.cluster", 123456, "63", "python3.11", "caching"};
  m.start_time_s = 1718000000.125;
  for (int i = 0; i < devices; ++i) {
    DeviceMetrics d;
    d.device = i;
    d.live_bytes = 41234567890ull + i;
    d.reserved_bytes = 52345678901ull;
    d.peak_bytes = 61234567890ull;
    d.peak_reserved_bytes = 72345678901ull;
    d.capacity_bytes = 85899345920ull;
    d.live_count = 12345;
    d.total_allocs = 987654321;
    d.total_frees = 987641976;
    m.devices.push_back(d);
  }
  return m;
}

void BM_RenderPrometheusText(benchmark::State& state) {
  const ProcessMetrics m = Figures(static_cast<int>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = to_prometheus_text(m);
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["file_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderPrometheusText)->Arg(1)->Arg(8);

void BM_ReplaceFileAtomically(benchmark::State& state) {
  const char* tmpdir = getenv("TMPDIR");
  std::string dir = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/gpushim-bench-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string path = dir + "/m.prom";
  const std::string text = to_prometheus_text(Figures(static_cast<int>(state.range(0))));
  for (auto _ : state)
    if (replace_file_atomically(path, text) != 0) state.SkipWithError("replace failed");
  unlink(path.c_str());
  rmdir(dir.c_str());
}
BENCHMARK(BM_ReplaceFileAtomically)->Arg(1)->Arg(8)->UseRealTime();

}  // namespace
}  // namespace gpushim

BENCHMARK_MAIN();
