// Streams and contexts that end while the pools still know them: each case is a few lines a real
// program writes, after which a pool that kept a destroyed stream's handle would hand it to the
// driver (a crash on a real GPU; on the simulated device, a misuse report that stops the process),
// or would reuse memory too early. Prints one JSON line of what it checked.
//
// Usage: e2e_stream_lifetimes CASE
//   freed_then_destroyed  cudaFreeAsync on s1, cudaStreamDestroy(s1), then the same size on s2
//   reset_live_stream     a non-blocking stream, cudaDeviceReset, then cudaMalloc/cudaFree rounds
//   reset_busy_destroyed  a busy non-blocking stream destroyed (its tail pending), then a reset
//   ctx_destroy           a stream-ordered free on a stream of a created context, cuCtxDestroy
//   per_thread            thread A frees on its per-thread stream behind a 300 ms fill; thread B
//                         allocates the same size twice on its own: never A's block too early
//   driver_capture        a capture begun with cuStreamBeginCapture (driver API): the allocation
//                         on the capturing stream is the graph's, not the pool's
//   abandoned_capture     a capture abandoned by destroying its stream: pools fence again after
//   refused_destroy       cuCtxDestroy of the runtime's primary context, which CUDA refuses: its
//                         streams live on, and a plain free must still wait for their work
//   churn THREADS ROUNDS  threads creating, using and destroying streams while others allocate
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;

size_t live_count() {
  gpushim_device_stats st{};
  return testsupport::shim_stats(0, &st) ? st.live_count : 0;
}

int freed_then_destroyed() {
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, 20 * kMiB, s1));
  CHECK(testsupport::delayed_fill(p, 0x5A, 20 * kMiB, 100000, s1));
  CHECK(cudaFreeAsync(p, s1));
  CHECK(cudaStreamDestroy(s1));  // its fill still runs
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, 20 * kMiB, s2));  // must not record anything on s1
  CHECK(cudaMemsetAsync(q, 0x11, 20 * kMiB, s2));
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaDeviceSynchronize());
  const bool intact = testsupport::holds(q, 20 * kMiB, 0x11);
  CHECK(cudaFreeAsync(q, s2));
  CHECK(cudaStreamDestroy(s2));
  std::printf("{\"case\": \"freed_then_destroyed\", \"intact\": %s}\n", intact ? "true" : "false");
  return intact ? 0 : 2;
}

int reset(bool busy) {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (busy) {
    // Memory no pool serves, so that the pool holds nothing at the reset (a pool that gives
    // memory back synchronizes first, which would finish the tail before the reset).
    void* p = nullptr;
    CHECK(cudaMallocManaged(&p, kMiB));
    CHECK(testsupport::delayed_fill(p, 0x22, kMiB, 200000, s));
    CHECK(cudaStreamDestroy(s));  // its tail is pending: fences wait for it, until the reset
  } else {
    testsupport::plain_rounds(2, 64 * kMiB);  // the pool has a segment, and fences have been recorded
  }
  CHECK(cudaDeviceReset());  // destroys `s` (if still alive) and the tail's event with the context
  testsupport::plain_rounds(8, 64 * kMiB);  // seals epochs: fences must name no stream of the old context
  std::printf("{\"case\": \"%s\", \"rounds\": 8}\n", busy ? "reset_busy_destroyed" : "reset_live_stream");
  return 0;
}

int ctx_destroy() {
  CHECK(cudaSetDevice(0));
  testsupport::plain_rounds(2, 64 * kMiB);  // the primary context, where the pool's segments live
  const testsupport::ProgramContext c = testsupport::make_program_context();
  testsupport::destroy_context(c.context);  // destroys its stream with it
  testsupport::make_current(c.primary);
  testsupport::plain_rounds(8, 64 * kMiB);  // seals epochs: their fences must not name the stream
  std::printf("{\"case\": \"ctx_destroy\"}\n");
  return 0;
}

int per_thread() {
  CHECK(cudaSetDevice(0));
  std::atomic<bool> freed{false};
  // A's fill is held until B has made both its blocks: its 300 ms alone could run out first on a
  // busy machine, and then B taking A's block would be right.
  std::atomic<bool> b_allocated{false};
  void* a_block = nullptr;
  std::thread a([&] {
    CHECK(cudaMallocAsync(&a_block, 20 * kMiB, cudaStreamPerThread));
    CHECK(testsupport::hold_stream_until(cudaStreamPerThread, &b_allocated));
    CHECK(testsupport::delayed_fill(a_block, 0xAA, 20 * kMiB, 300000, cudaStreamPerThread));
    CHECK(cudaFreeAsync(a_block, cudaStreamPerThread));
    freed = true;
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));  // keeps the thread (and its stream) until the fill is done
  });
  while (!freed) std::this_thread::yield();
  bool reused_early = false;
  bool intact = true;
  std::thread b([&] {
    void* got[2] = {};
    for (void*& g : got) {
      CHECK(cudaMallocAsync(&g, 20 * kMiB, cudaStreamPerThread));
      CHECK(cudaMemsetAsync(g, 0x33, 20 * kMiB, cudaStreamPerThread));
      CHECK(cudaStreamSynchronize(cudaStreamPerThread));
      reused_early |= g == a_block;
    }
    b_allocated.store(true, std::memory_order_release);
    a.join();  // A's fill has finished now: a block it still wrote into shows it
    CHECK(cudaDeviceSynchronize());
    for (void* g : got) intact &= testsupport::holds(g, 20 * kMiB, 0x33);
    for (void* g : got) CHECK(cudaFreeAsync(g, cudaStreamPerThread));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  });
  b.join();
  std::printf("{\"case\": \"per_thread\", \"intact\": %s, \"got_a_block\": %s}\n", intact ? "true" : "false",
              reused_early ? "true" : "false");
  return intact ? 0 : 2;
}

int driver_capture() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  using Begin = CUresult (*)(CUstream, CUstreamCaptureMode);
  using End = CUresult (*)(CUstream, CUgraph*);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  testsupport::plain_rounds(2, kMiB);  // a pool with history
  const size_t live_before = live_count();
  CHECK_CU(testsupport::driver_function<Begin>("cuStreamBeginCapture_v2")(reinterpret_cast<CUstream>(s),
                                                                          CU_STREAM_CAPTURE_MODE_RELAXED));
  void* g = nullptr;
  CHECK(cudaMallocAsync(&g, kMiB, s));  // a graph memory node: the graph's, not the pool's
  CHECK(cudaFreeAsync(g, s));
  CUgraph graph = nullptr;
  const CUresult end = testsupport::driver_function<End>("cuStreamEndCapture")(reinterpret_cast<CUstream>(s), &graph);
  const size_t live_after = live_count();
  if (graph) testsupport::driver().GraphDestroy(graph);
  testsupport::plain_rounds(2, kMiB);
  CHECK(cudaStreamDestroy(s));
  std::printf("{\"case\": \"driver_capture\", \"end\": %d, \"live_before\": %zu, \"live_after\": %zu}\n",
              static_cast<int>(end), live_before, live_after);
  return end == CUDA_SUCCESS ? 0 : 2;
}

int abandoned_capture() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CHECK(cudaStreamDestroy(s));  // abandons the capture
  testsupport::plain_rounds(64, 4 * kMiB);   // reusable again only if the pool fences again
  gpushim_device_stats st{};
  const bool shim = testsupport::shim_stats(0, &st);
  std::printf("{\"case\": \"abandoned_capture\", \"shim\": %s, \"peak_reserved\": %llu}\n", shim ? "true" : "false",
              static_cast<unsigned long long>(shim ? st.peak_reserved_bytes : 0));
  return 0;
}

// Stream churners create a stream, allocate, fill, free on it and destroy it (with work still
// queued); allocators make plain and stream-ordered allocations on streams of their own.
int refused_destroy() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  using GetCurrent = CUresult (*)(CUcontext*);
  using Destroy = CUresult (*)(CUcontext);
  CUcontext primary = nullptr;
  CHECK_CU(testsupport::driver_function<GetCurrent>("cuCtxGetCurrent")(&primary));
  // A primary context is reset, never destroyed: the call is refused and changes nothing.
  const CUresult destroy = testsupport::driver_function<Destroy>("cuCtxDestroy_v2")(primary);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 8 * kMiB));
  CHECK(testsupport::delayed_fill(p, 0x5A, 8 * kMiB, 300000, s));
  CHECK(cudaFree(p));  // synchronizes in CUDA: the fill on s is over before p is anyone's again
  void* q = nullptr;
  CHECK(cudaMalloc(&q, 8 * kMiB));
  CHECK(cudaMemset(q, 0x11, 8 * kMiB));
  CHECK(cudaStreamSynchronize(s));
  const bool intact = testsupport::holds(q, 8 * kMiB, 0x11);
  CHECK(cudaFree(q));
  CHECK(cudaStreamDestroy(s));
  std::printf("{\"case\": \"refused_destroy\", \"destroy\": %d, \"intact\": %s}\n", static_cast<int>(destroy),
              intact ? "true" : "false");
  return intact ? 0 : 2;
}

int churn(int threads, int rounds) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  std::atomic<long> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      CHECK(cudaSetDevice(0));
      if (t % 2 == 0) {
        for (int i = 0; i < rounds; ++i) {
          cudaStream_t s;
          CHECK(cudaStreamCreateWithFlags(&s, i % 3 == 0 ? cudaStreamDefault : cudaStreamNonBlocking));
          void* p = nullptr;
          const size_t bytes = (64 << 10) << (i % 6);
          CHECK(cudaMallocAsync(&p, bytes, s));
          CHECK(cudaMemsetAsync(p, 0x44, bytes, s));
          if (i % 4 == 0) CHECK(testsupport::delayed_fill(p, 0x45, bytes, 2000, s));
          CHECK(cudaFreeAsync(p, s));
          CHECK(cudaStreamDestroy(s));
        }
      } else {
        cudaStream_t mine;
        CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
        for (int i = 0; i < rounds; ++i) {
          const size_t bytes = (64 << 10) << (i % 6);
          void* p = nullptr;
          const unsigned char tag = static_cast<unsigned char>(0x60 + t);
          if (i % 2 == 0) {
            CHECK(cudaMalloc(&p, bytes));
            CHECK(cudaMemset(p, tag, bytes));
            if (!testsupport::holds(p, 4096, tag)) ++bad;
            CHECK(cudaFree(p));
          } else {
            CHECK(cudaMallocAsync(&p, bytes, mine));
            CHECK(cudaMemsetAsync(p, tag, bytes, mine));
            CHECK(cudaStreamSynchronize(mine));
            if (!testsupport::holds(p, 4096, tag)) ++bad;
            CHECK(cudaFreeAsync(p, mine));
          }
        }
        CHECK(cudaStreamSynchronize(mine));
        CHECK(cudaStreamDestroy(mine));
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(cudaDeviceSynchronize());
  std::printf("{\"case\": \"churn\", \"corruptions\": %ld, \"live_count\": %zu}\n", bad.load(), live_count());
  return bad == 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string c = argc > 1 ? argv[1] : "";
  if (c == "freed_then_destroyed") return freed_then_destroyed();
  if (c == "reset_live_stream") return reset(false);
  if (c == "reset_busy_destroyed") return reset(true);
  if (c == "ctx_destroy") return ctx_destroy();
  if (c == "per_thread") return per_thread();
  if (c == "driver_capture") return driver_capture();
  if (c == "abandoned_capture") return abandoned_capture();
  if (c == "refused_destroy") return refused_destroy();
  if (c == "churn") return churn(argc > 2 ? std::atoi(argv[2]) : 4, argc > 3 ? std::atoi(argv[3]) : 100);
  std::fprintf(stderr, "usage: e2e_stream_lifetimes CASE (see the source)\n");
  return 64;
}
