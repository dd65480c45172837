// What GPUSHIM_TRACE costs: nanoseconds added on the allocating thread per event, and bytes per
// event on disk. Results go to docs/benchmarks.md.
//
//   build/bin/gpushim_trace_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "policy/policy_factory.h"
#include "policy/sim_backend.h"
#include "replay.h"
#include "run_view.h"
#include "stacks/stack_table.h"
#include "trace/trace_encoder.h"
#include "recorder/trace_ordered_resource.h"
#include "trace/trace_recorder.h"
#include "trace_reader.h"
#include "util/clock.h"

namespace gpushim {
namespace {

using trace::EventKind;
using trace::TraceEvent;

std::string temp_path() {
  char tmpl[] = "/tmp/gpushim-trace-bench-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  return tmpl;
}

// An allocation-heavy workload of the shape training jobs have: sizes from 512 B to 64 MiB,
// lifetimes mostly short, 40 call sites, one stream, served by a pool (so every event carries its
// pool sequence number, as under the caching policy).
std::vector<TraceEvent> workload(size_t n, uint64_t start) {
  std::mt19937_64 rng(7);
  std::vector<TraceEvent> out;
  std::vector<TraceEvent> live;
  uint64_t t = start, next = 0x7f0000000000ull;
  out.reserve(n);
  while (out.size() < n) {
    t += 300 + rng() % 3000;
    TraceEvent e;
    e.t_ns = t;
    if (live.size() < 64 && (live.empty() || rng() % 2)) {
      e.kind = EventKind::kAlloc;
      e.requested = 512ull << (rng() % 18);
      e.size = e.requested;
      e.addr = next;
      next += e.size + 512;
      e.stack = static_cast<uint32_t>(16 * (1 + rng() % 40));
      live.push_back(e);
    } else {
      const size_t k = rng() % live.size();
      e = live[k];
      live[k] = live.back();
      live.pop_back();
      e.t_ns = t;
      e.kind = EventKind::kFree;
    }
    e.flags = trace::kFlagSequenced;
    e.seq = out.size() + 1;
    out.push_back(e);
  }
  return out;
}

trace::HeaderInfo header() {
  trace::HeaderInfo h;
  h.pid = static_cast<int>(getpid());
  h.exe = "gpushim_trace_bench";
  h.policy = "caching";
  h.start_mono_ns = now_ns();
  return h;
}

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The allocating thread's cost of record(): copying an event into its ring. Timed in bursts of
// 1024 events on the recording thread's own CPU clock (the writer thread, draining and writing
// the file between bursts, is another thread's cost), so nothing is dropped.
void BM_RecordEvent(benchmark::State& state) {
  const std::string path = temp_path();
  StackTable stacks;
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  auto rec = trace::TraceRecorder::start(fd, path, header(), &stacks);
  const std::vector<TraceEvent> events = workload(1 << 16, now_ns());
  size_t i = 0;
  uint64_t total_ns = 0;
  for (auto _ : state) {
    const uint64_t t0 = thread_cpu_ns();
    for (int k = 0; k < 1024; ++k) {
      rec->record(events[i]);
      i = (i + 1) & ((1 << 16) - 1);
    }
    const uint64_t burst = thread_cpu_ns() - t0;
    total_ns += burst;
    state.SetIterationTime(static_cast<double>(burst) / 1e9);
    rec->flush();
  }
  rec->finish(trace::EndInfo{});
  state.counters["ns_per_event"] = static_cast<double>(total_ns) / static_cast<double>(state.iterations() * 1024);
  state.counters["dropped"] = static_cast<double>(rec->dropped());
  unlink(path.c_str());
}
BENCHMARK(BM_RecordEvent)->UseManualTime()->MinTime(0.05);

// The clock read a traced free pays when CUDA frees the memory (forwarded frees).
void BM_ClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(now_ns());
}
BENCHMARK(BM_ClockRead);

// The pool wrapper that orders the trace as the pool orders its work: an alloc+free pair through
// the caching pool on the simulated device, bare (arg 0) and wrapped (arg 1). The difference, per
// operation, is the wrapper's lock and clock read.
void BM_PoolPair(benchmark::State& state) {
  SimBackend sim(64ull << 30);
  Config c;
  std::unique_ptr<DeviceMemoryResource> pool = make_pool(c, sim);
  if (state.range(0)) pool = std::make_unique<trace::TraceOrderedResource>(std::move(pool));
  std::vector<void*> held(8, nullptr);
  uint64_t allocated = 0;
  size_t k = 0;
  for (auto _ : state) {
    void* p = nullptr;
    pool->allocate(AllocRequest{static_cast<size_t>(4096 << (k & 7)), nullptr, true}, &p, &allocated);
    pool->deallocate(p, nullptr, true);
    ++k;
  }
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_PoolPair)->Arg(0)->Arg(1);

// Bytes per event on disk: the workload recorded through a real recorder (header, module map and
// 40 stacks of 24 frames included), and the event coding alone.
void BM_BytesPerEvent(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  StackTable stacks;
  // 40 distinct 24-frame stacks of addresses inside this binary, like a real program's.
  const uint64_t base = reinterpret_cast<uint64_t>(&BM_BytesPerEvent);
  std::vector<uint32_t> ids;
  for (uint64_t s = 0; s < 40; ++s) {
    uint64_t words[24];
    for (uint64_t f = 0; f < 24; ++f) words[f] = base + 16 * ((s * 7 + f * 13) % 512);
    ids.push_back(stacks.intern(words, 24));
  }
  double file_bytes = 0, coded_bytes = 0;
  for (auto _ : state) {
    std::vector<TraceEvent> events = workload(n, now_ns());
    for (TraceEvent& e : events) e.stack = ids[e.stack / 16 - 1];
    const std::string path = temp_path();
    const int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    trace::RecorderOptions opt;
    opt.ring_events = 1 << 20;
    auto rec = trace::TraceRecorder::start(fd, path, header(), &stacks, opt);
    for (const TraceEvent& e : events) rec->record(e);
    rec->finish(trace::EndInfo{});
    struct stat st;
    stat(path.c_str(), &st);
    file_bytes = static_cast<double>(st.st_size);
    unlink(path.c_str());
    std::string payload;
    trace::EventEncoder enc(&payload);
    for (const TraceEvent& e : events) enc.add(e);
    enc.finish();
    coded_bytes = static_cast<double>(payload.size());
  }
  state.counters["file_bytes_per_event"] = file_bytes / static_cast<double>(n);
  state.counters["event_bytes_per_event"] = coded_bytes / static_cast<double>(n);
}
BENCHMARK(BM_BytesPerEvent)->Arg(10000)->Arg(1000000)->Iterations(1)->Unit(benchmark::kMillisecond);

// Replay throughput (what gpushim-analyze replay prints as events/s), per policy.
void BM_Replay(benchmark::State& state) {
  analysis::TraceData t;
  t.header.policy = "caching";
  t.events = workload(200000, 1000);
  analysis::ReplaySettings s;
  s.config.policy = state.range(0) ? PolicyKind::kCaching : PolicyKind::kPassthrough;
  for (auto _ : state) benchmark::DoNotOptimize(analysis::replay_trace(t, s));
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(t.events.size()));
}
BENCHMARK(BM_Replay)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpushim

BENCHMARK_MAIN();
