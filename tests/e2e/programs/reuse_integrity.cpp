// Randomized stress of safe reuse with data integrity: many threads, every kind of stream
// (non-blocking, blocking, the legacy default stream, the per-thread default stream, and streams
// destroyed while their work still runs, with blocks freed on them plainly or stream-ordered), slow "kernels" (delayed fills) still writing into memory
// that was just freed, and random sizes from 1 B to 40 MiB. Any pool that hands memory out again before earlier work finished gets caught: the
// late fill overwrites the new owner's data. At every checkpoint all threads stop, and the program
// checks that no two live blocks overlap and that the shim's live count and requested bytes equal
// exactly what the program holds.
//
// Usage: e2e_reuse_integrity [threads] [iterations per thread] [seed]
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "support/test_support.h"

namespace {

constexpr unsigned char kStale = 0xAA;  // what a late fill writes into freed memory

struct Held {
  void* ptr;
  size_t size;
  unsigned char tag;
};

std::atomic<long> g_corruptions{0}, g_ops{0};

size_t random_size(std::mt19937_64& rng) {
  const unsigned r = rng() % 100;
  if (r < 70) return 1 + rng() % (64 << 10);
  if (r < 96) return 1 + rng() % (8 << 20);
  // Rarely, past the caching pool's 20 MiB large segments. Sizes past the pools' thresholds (10
  // MiB: a segment of its own) add no path, only pages for the simulated device to write.
  return (24u << 20) + rng() % (16u << 20);
}

// Checks a few windows of the block (start, middle, end): a late fill covers the whole block.
void verify(const Held& h) {
  const size_t window = std::min<size_t>(h.size, 4096);
  std::vector<unsigned char> buf(window);
  for (size_t off : {size_t{0}, (h.size - window) / 2, h.size - window}) {
    CHECK(cudaMemcpy(buf.data(), static_cast<char*>(h.ptr) + off, window, cudaMemcpyDeviceToHost));
    for (unsigned char c : buf)
      if (c != h.tag) {
        g_corruptions++;
        std::fprintf(stderr, "corruption: block %p (+%zu) of %zu bytes holds 0x%02x, expected 0x%02x\n", h.ptr, off,
                     h.size, c, h.tag);
        return;
      }
  }
}

}  // namespace

// Proves the detector works: reusing memory while a delayed fill is pending, with no pool and no
// wait, must show up as corruption. Returns the number of corrupted blocks seen (expected > 0).
int self_test() {
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 1 << 16));
  // The late fill is made to come after the reuse by an event, not by its delay alone: a busy
  // machine that held this thread up 20 ms let the fill land first, and the reuse hid it.
  cudaEvent_t reused;
  CHECK(cudaEventCreateWithFlags(&reused, cudaEventDisableTiming));
  CHECK(cudaMemsetAsync(p, 0x11, 1 << 16, s2));  // "reused" at once by another stream
  CHECK(cudaEventRecord(reused, s2));
  CHECK(cudaStreamWaitEvent(s1, reused, 0));
  CHECK(testsupport::delayed_fill(p, kStale, 1 << 16, 20000, s1));
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaDeviceSynchronize());
  verify(Held{p, 1 << 16, 0x11});
  CHECK(cudaEventDestroy(reused));
  CHECK(cudaFree(p));
  std::printf("{\"self_test_corruptions\":%ld}\n", g_corruptions.load());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--self-test") == 0) return self_test();
  const int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  const unsigned seed = argc > 3 ? static_cast<unsigned>(std::atoi(argv[3])) : 1;
  constexpr int kCheckpointEvery = 25;
  std::vector<std::vector<Held>> held(threads);
  long checkpoints = 0, accounting_mismatches = 0, overlaps = 0;
  bool have_stats = true;

  auto checkpoint = [&]() noexcept {
    // All threads are parked at the barrier: the program's view and the shim's must agree exactly.
    CHECK(cudaDeviceSynchronize());
    std::vector<Held> all;
    for (auto& v : held) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end(), [](const Held& a, const Held& b) { return a.ptr < b.ptr; });
    for (size_t i = 1; i < all.size(); ++i)
      if (static_cast<char*>(all[i - 1].ptr) + all[i - 1].size > static_cast<char*>(all[i].ptr)) overlaps++;
    unsigned long long bytes = 0;
    for (const Held& h : all) bytes += h.size;
    gpushim_device_stats st;
    if (testsupport::shim_stats(0, &st)) {
      if (st.live_count != all.size() || st.requested_bytes != bytes) {
        accounting_mismatches++;
        std::fprintf(stderr, "accounting: shim has %llu live / %llu requested bytes, program holds %zu / %llu\n",
                     st.live_count, st.requested_bytes, all.size(), bytes);
      }
    } else {
      have_stats = false;
    }
    checkpoints++;
  };
  std::barrier sync_point(threads, checkpoint);

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 7919 + t);
      cudaStream_t s1, s2, blocking;
      CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
      CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      CHECK(cudaStreamCreate(&blocking));
      // Where a plain cudaFree's pending work may run. The reuse below is on s2, non-blocking, so
      // nothing but the pool orders it after that work.
      const cudaStream_t fill_streams[] = {s1, blocking, nullptr /* legacy */, cudaStreamPerThread};
      std::vector<Held>& mine = held[t];
      for (int i = 0; i < iterations; ++i) {
        size_t n = random_size(rng);
        // Half of the plain frees below use a block that is a pool segment of its own (over 10 MiB):
        // the very next request of its size finds nothing free and asks the pool's reuse rules at
        // once, while the slow fill still writes the block. Reuse that came too early shows.
        const bool own_segment = rng() % 2;
        const size_t large = (12u << 20) + rng() % (20u << 20);
        const unsigned delay = 20 + rng() % 400;
        const unsigned char tag = static_cast<unsigned char>(1 + rng() % 0x7f);
        void* p = nullptr;
        void* q = nullptr;
        switch (rng() % 5) {
          case 0:  // cudaFree while a slow kernel still writes the block; reuse must wait
            if (own_segment) n = large;
            CHECK(cudaMalloc(&p, n));
            // Slower than the ops that follow: the pool meets this block again while it is written.
            CHECK(testsupport::delayed_fill(p, kStale, n, 10 * delay, fill_streams[rng() % 4]));
            CHECK(cudaFree(p));
            CHECK(cudaMalloc(&q, n));
            CHECK(cudaMemsetAsync(q, tag, n, s2));
            CHECK(cudaStreamSynchronize(s2));
            break;
          case 1:  // stream-ordered free on s1, reuse on s2: must wait for s1's work
            CHECK(cudaMallocAsync(&p, n, s1));
            CHECK(testsupport::delayed_fill(p, kStale, n, delay, s1));
            CHECK(cudaFreeAsync(p, s1));
            CHECK(cudaMallocAsync(&q, n, s2));
            CHECK(cudaMemsetAsync(q, tag, n, s2));
            CHECK(cudaStreamSynchronize(s2));
            break;
          case 2:  // stream-ordered free and reuse on the same stream: safe at once, in order
            CHECK(cudaMallocAsync(&p, n, s1));
            CHECK(testsupport::delayed_fill(p, kStale, n, delay, s1));
            CHECK(cudaFreeAsync(p, s1));
            CHECK(cudaMallocAsync(&q, n, s1));
            CHECK(cudaMemsetAsync(q, tag, n, s1));
            CHECK(cudaStreamSynchronize(s1));
            break;
          case 3: {  // the stream that still writes the block is destroyed before the free
            if (own_segment) n = large;
            cudaStream_t gone;
            CHECK(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking));
            CHECK(cudaMalloc(&p, n));
            CHECK(testsupport::delayed_fill(p, kStale, n, 10 * delay, gone));
            CHECK(cudaStreamDestroy(gone));  // returns at once; the fill still runs
            CHECK(cudaFree(p));
            CHECK(cudaMalloc(&q, n));
            CHECK(cudaMemsetAsync(q, tag, n, s2));
            CHECK(cudaStreamSynchronize(s2));
            // And freed stream-ordered on a stream then destroyed while the fill runs: the block
            // carries a dead stream handle; reuse elsewhere must wait for that stream's last work.
            cudaStream_t gone_async;
            void* r = nullptr;
            void* reused = nullptr;
            CHECK(cudaStreamCreateWithFlags(&gone_async, cudaStreamNonBlocking));
            CHECK(cudaMallocAsync(&r, n, gone_async));
            CHECK(testsupport::delayed_fill(r, kStale, n, 10 * delay, gone_async));
            CHECK(cudaFreeAsync(r, gone_async));
            CHECK(cudaStreamDestroy(gone_async));
            CHECK(cudaMallocAsync(&reused, n, s2));
            CHECK(cudaMemsetAsync(reused, tag, n, s2));
            CHECK(cudaStreamSynchronize(s2));
            mine.push_back({reused, n, tag});
            break;
          }
          default:  // release a held block after checking it
            if (!mine.empty()) {
              const size_t k = rng() % mine.size();
              CHECK(cudaDeviceSynchronize());
              verify(mine[k]);
              if (rng() % 2) {
                CHECK(cudaFree(mine[k].ptr));
              } else {
                CHECK(cudaFreeAsync(mine[k].ptr, s2));
              }
              mine[k] = mine.back();
              mine.pop_back();
            }
            break;
        }
        if (q) mine.push_back({q, n, tag});
        // Bound the memory a thread holds; big blocks go first.
        while (mine.size() > 6) {
          CHECK(cudaDeviceSynchronize());
          verify(mine.front());
          CHECK(cudaFree(mine.front().ptr));
          mine.erase(mine.begin());
        }
        g_ops++;
        if ((i + 1) % kCheckpointEvery == 0) sync_point.arrive_and_wait();
      }
      // Stop at a last checkpoint with every thread's blocks still held, then verify and free them.
      sync_point.arrive_and_wait();
      CHECK(cudaDeviceSynchronize());
      for (const Held& h : mine) {
        verify(h);
        CHECK(cudaFree(h.ptr));
      }
      mine.clear();
      CHECK(cudaStreamDestroy(s1));
      CHECK(cudaStreamDestroy(s2));
      CHECK(cudaStreamDestroy(blocking));
    });
  }
  for (auto& th : pool) th.join();
  std::printf("{\"ops\":%ld,\"corruptions\":%ld,\"overlaps\":%ld,\"accounting_mismatches\":%ld,\"checkpoints\":%ld,"
              "\"shim\":%s}\n",
              g_ops.load(), g_corruptions.load(), overlaps, accounting_mismatches, checkpoints,
              have_stats ? "true" : "false");
  return (g_corruptions || overlaps || accounting_mismatches) ? 1 : 0;
}
