// Cost of capturing an allocation's stack with Python frames (docs/benchmarks.md, "Python stacks").
//
// Built as a shared library that python_stacks_bench.py loads with ctypes and calls from a chain
// of Python frames (20 by default), without the GIL, as PyTorch allocates: the benchmarks then
// capture exactly what the shim's allocation hook captures there, with the same code
// (StackCapturer from gpushim_core).
#include <benchmark/benchmark.h>

#include <memory>

#include "python/python_code_table.h"
#include "python/python_frame_walker.h"
#include "python/python_runtime.h"
#include "stacks/native_stack.h"
#include "stacks/stack_capturer.h"
#include "stacks/stack_table.h"

namespace gpushim {
namespace {

size_t count_python(const StackTable& table, StackId id) {
  std::vector<uint64_t> words;
  table.frames(id, &words);
  size_t n = 0;
  for (uint64_t w : words) n += is_python_frame(w);
  return n;
}

void capture(benchmark::State& state, bool python, bool cache = true) {
  StackTable table;
  StackCapturer capturer(StackCaptureOptions{32, python, "", 0, 0, cache}, &table, nullptr);
  StackId id = kEmptyStack;
  for (auto _ : state) {
    id = capturer.capture();
    benchmark::DoNotOptimize(id);
  }
  state.counters["python_frames"] = static_cast<double>(count_python(table, id));
  std::vector<uint64_t> words;
  table.frames(id, &words);
  state.counters["frames"] = static_cast<double>(words.size());
  if (python && !capturer.python_active()) state.SkipWithError(("no Python frames: " + capturer.python_status()).c_str());
}

// What the allocation hook pays with GPUSHIM_PYTHON_STACKS=1 at a repeated site: the Python walk
// and the stack cache's check of the words the last unwind read (a hit every time here).
void BM_CaptureNativeAndPython(benchmark::State& state) { capture(state, true); }
// The same hook with GPUSHIM_PYTHON_STACKS=0: native frames only (32 at most).
void BM_CaptureNativeOnly(benchmark::State& state) { capture(state, false); }

// The same without the per-thread stack cache (stack_cache.h): a full unwind, a location lookup per
// Python frame and interning on every capture, as before issue 30 and on a site's first captures.
void BM_CaptureNativeAndPythonUncached(benchmark::State& state) { capture(state, true, false); }
void BM_CaptureNativeOnlyUncached(benchmark::State& state) { capture(state, false, false); }

// The Python part alone: walking the thread's frames and looking up their interned locations.
void BM_PythonWalkAndLookup(benchmark::State& state) {
  const PythonDetection d = detect_python();
  if (d.support != PythonSupport::kSupported) {
    state.SkipWithError("no supported Python interpreter in this process");
    return;
  }
  PythonCodeTable table(d.runtime, "");
  PyFrameRef frames[StackCapturer::kMaxPythonFrames];
  size_t n = 0;
  for (auto _ : state) {
    n = walk_python_frames(d.runtime, frames, StackCapturer::kMaxPythonFrames);
    bool site = false;
    uint32_t sum = 0;
    for (size_t i = 0; i < n; ++i) sum += table.location(frames[i].code, frames[i].byte_offset, &site);
    benchmark::DoNotOptimize(sum);
  }
  state.counters["python_frames"] = static_cast<double>(n);
}

// The native unwind alone, as deep as the Python capture unwinds.
void BM_NativeUnwindFull(benchmark::State& state) {
  init_native_unwinder();
  uint64_t buf[StackCapturer::kMaxNativeUnwind];
  size_t n = 0;
  for (auto _ : state) {
    n = capture_native_stack(buf, StackCapturer::kMaxNativeUnwind, 0);
    benchmark::DoNotOptimize(buf[0]);
  }
  state.counters["native_frames"] = static_cast<double>(n);
}

BENCHMARK(BM_CaptureNativeAndPython);
BENCHMARK(BM_CaptureNativeOnly);
BENCHMARK(BM_CaptureNativeAndPythonUncached);
BENCHMARK(BM_CaptureNativeOnlyUncached);
BENCHMARK(BM_PythonWalkAndLookup);
BENCHMARK(BM_NativeUnwindFull);

}  // namespace
}  // namespace gpushim

// Entry point for the Python driver: Google Benchmark's usual command line.
extern "C" __attribute__((visibility("default"))) int run_python_stack_benchmarks(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
