// Soak: THREADS threads, each with STREAMS streams of its own, run random allocation work for a
// long time and check everything they can:
//   - integrity: every block carries a tag written on one of its streams; it is checked before it
//     is freed and at random. Some blocks are freed while a slow "kernel" still writes stale bytes
//     into them (cudaFree, or cudaFreeAsync on the same or on another stream ordered by an event);
//     memory handed out again too early shows up as stale bytes in its new owner;
//   - accounting: every CHECK_EVERY operations all threads stop at a barrier, and the shim's live
//     count and requested bytes must equal exactly what the program holds; no two live blocks may
//     overlap;
//   - the shim's own host memory (gpushim_host_bytes) is sampled at every checkpoint, against the
//     number of live allocations.
// Ends by freeing everything. Prints one JSON line of figures.
//
// Usage: e2e_soak THREADS STREAMS OPS_PER_THREAD [SEED] [CHECK_EVERY] [MAX_HELD_PER_THREAD]
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "support/test_support.h"

namespace {

constexpr unsigned char kStale = 0xEE;  // what a late "kernel" writes into memory already freed
constexpr size_t kWindow = 4096;         // bytes checked at each end and in the middle of big blocks
constexpr size_t kWholeBlock = 64 << 10;  // blocks up to this are tagged and checked entirely

struct Block {
  void* ptr;
  size_t size;
  unsigned char tag;
  int stream;     // index of the stream that wrote the tag
  bool async;     // from cudaMallocAsync: freed with cudaFreeAsync
};

std::atomic<long> g_ops{0}, g_allocs{0}, g_frees{0}, g_corruptions{0}, g_checks{0}, g_hazards{0};

size_t random_size(std::mt19937_64& rng) {
  const unsigned r = rng() % 1000;
  if (r < 700) return 1 + rng() % (16 << 10);
  if (r < 950) return 1 + rng() % (256 << 10);
  if (r < 999) return 1 + rng() % (4 << 20);
  return (4 << 20) + rng() % (28 << 20);
}

// The byte ranges of a block that carry its tag.
template <typename F>
void for_each_window(const Block& b, F&& f) {
  if (b.size <= kWholeBlock) {
    f(size_t{0}, b.size);
    return;
  }
  f(size_t{0}, kWindow);
  f((b.size - kWindow) / 2, kWindow);
  f(b.size - kWindow, kWindow);
}

void tag(const Block& b, cudaStream_t s) {
  for_each_window(b, [&](size_t off, size_t n) { CHECK(cudaMemsetAsync(static_cast<char*>(b.ptr) + off, b.tag, n, s)); });
}

// Requires that the block's stream has finished writing it.
void verify(const Block& b, std::vector<unsigned char>& buf) {
  g_checks++;
  bool bad = false;
  for_each_window(b, [&](size_t off, size_t n) {
    if (bad) return;
    buf.resize(n);
    CHECK(cudaMemcpy(buf.data(), static_cast<char*>(b.ptr) + off, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i)
      if (buf[i] != b.tag) {
        std::fprintf(stderr, "corruption: block %p (%zu bytes) holds 0x%02x at +%zu, expected 0x%02x\n", b.ptr, b.size,
                     buf[i], off + i, b.tag);
        bad = true;
        return;
      }
  });
  if (bad) g_corruptions++;
}

// Proves the detector works: a block written by a slow kernel after its new tag must be caught.
int self_test() {
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  Block blk{nullptr, 100 << 10, 0x42, 0, false};
  CHECK(cudaMalloc(&blk.ptr, blk.size));
  // The slow kernel is made to come after the reuse by an event, not by its delay alone: a busy
  // machine that held this thread up 20 ms let it land first, and the new tag hid it.
  cudaEvent_t reused;
  CHECK(cudaEventCreateWithFlags(&reused, cudaEventDisableTiming));
  tag(blk, b);  // "reused" by b before a's kernel has run
  CHECK(cudaEventRecord(reused, b));
  CHECK(cudaStreamWaitEvent(a, reused, 0));
  CHECK(testsupport::delayed_fill(blk.ptr, kStale, blk.size, 20000, a));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventDestroy(reused));
  std::vector<unsigned char> buf;
  verify(blk, buf);
  CHECK(cudaFree(blk.ptr));
  std::printf("{\"self_test_corruptions\":%ld}\n", g_corruptions.load());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--self-test") == 0) return self_test();
  if (argc < 4) return 2;
  const int threads = std::atoi(argv[1]);
  const int nstreams = std::atoi(argv[2]);
  const long ops = std::atol(argv[3]);
  const unsigned seed = argc > 4 ? static_cast<unsigned>(std::atoi(argv[4])) : 1;
  const long check_every = argc > 5 ? std::atol(argv[5]) : std::max<long>(200, ops / 20);
  const size_t max_held = argc > 6 ? std::strtoul(argv[6], nullptr, 10) : 48;
  using HostBytesFn = unsigned long long (*)();
  const auto host_bytes = reinterpret_cast<HostBytesFn>(dlsym(RTLD_DEFAULT, "gpushim_host_bytes"));

  std::vector<std::vector<Block>> held(threads);
  long checkpoints = 0, mismatches = 0, overlaps = 0;
  size_t max_live = 0;
  unsigned long long host_first = 0, host_last = 0, host_max = 0;
  double worst_per_live = 0;
  bool have_stats = true;
  auto checkpoint = [&]() noexcept {
    CHECK(cudaDeviceSynchronize());
    std::vector<Block> all;
    for (auto& v : held) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end(), [](const Block& a, const Block& b) { return a.ptr < b.ptr; });
    for (size_t i = 1; i < all.size(); ++i)
      if (static_cast<char*>(all[i - 1].ptr) + all[i - 1].size > static_cast<char*>(all[i].ptr)) overlaps++;
    unsigned long long bytes = 0;
    for (const Block& b : all) bytes += b.size;
    gpushim_device_stats st;
    if (testsupport::shim_stats(0, &st)) {
      if (st.live_count != all.size() || st.requested_bytes != bytes) {
        mismatches++;
        std::fprintf(stderr, "accounting: shim has %llu live / %llu requested bytes, program holds %zu / %llu\n",
                     st.live_count, st.requested_bytes, all.size(), bytes);
      }
    } else {
      have_stats = false;
    }
    max_live = std::max(max_live, all.size());
    if (host_bytes) {
      host_last = host_bytes();
      if (checkpoints == 0) host_first = host_last;
      host_max = std::max(host_max, host_last);
      if (!all.empty()) worst_per_live = std::max(worst_per_live, static_cast<double>(host_last) / max_live);
    }
    checkpoints++;
  };
  std::barrier sync_point(threads, checkpoint);

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 1000003ull + static_cast<unsigned>(t));
      std::vector<cudaStream_t> streams(nstreams);
      for (auto& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      cudaEvent_t event;
      CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      std::vector<Block>& mine = held[t];
      std::vector<unsigned char> buf;
      auto release = [&](size_t k, bool hazard) {
        Block b = mine[k];
        mine[k] = mine.back();
        mine.pop_back();
        cudaStream_t own = streams[b.stream];
        if (hazard) {
          // A slow kernel still writes the block when it is freed: the pool must wait for it.
          g_hazards++;
          if (b.size <= 256 << 10) {
            CHECK(testsupport::delayed_fill(b.ptr, kStale, b.size, 20 + rng() % 300, own));
          } else {
            CHECK(testsupport::delayed_fill(b.ptr, kStale, kWindow, 20 + rng() % 300, own));
            CHECK(testsupport::delayed_fill(static_cast<char*>(b.ptr) + b.size - kWindow, kStale, kWindow, 0, own));
          }
        } else {
          CHECK(cudaStreamSynchronize(own));
          verify(b, buf);
        }
        if (!b.async) {
          CHECK(cudaFree(b.ptr));
        } else if (rng() % 2) {
          CHECK(cudaFreeAsync(b.ptr, own));
        } else {
          // Freed on another stream, ordered after the writes by an event, as CUDA requires.
          cudaStream_t other = streams[rng() % streams.size()];
          CHECK(cudaEventRecord(event, own));
          CHECK(cudaStreamWaitEvent(other, event, 0));
          CHECK(cudaFreeAsync(b.ptr, other));
        }
        g_frees++;
      };
      for (long i = 0; i < ops; ++i) {
        const unsigned op = rng() % 100;
        const int si = static_cast<int>(rng() % streams.size());
        cudaStream_t s = streams[si];
        if (op < 45 && mine.size() < max_held) {
          Block b{nullptr, random_size(rng), static_cast<unsigned char>(1 + rng() % 0xE0), si, false};
          const unsigned api = rng() % 10;
          if (api < 5) {
            CHECK(cudaMalloc(&b.ptr, b.size));
          } else if (api < 9) {
            CHECK(cudaMallocAsync(&b.ptr, b.size, s));
            b.async = true;
          } else {
            size_t pitch = 0;
            CHECK(cudaMallocPitch(&b.ptr, &pitch, b.size, 1));
          }
          tag(b, s);
          mine.push_back(b);
          g_allocs++;
        } else if (op < 80 && !mine.empty()) {
          release(rng() % mine.size(), rng() % 5 == 0);
        } else if (!mine.empty()) {
          const Block& b = mine[rng() % mine.size()];
          CHECK(cudaStreamSynchronize(streams[b.stream]));
          verify(b, buf);
        }
        g_ops++;
        if ((i + 1) % check_every == 0) sync_point.arrive_and_wait();
      }
      sync_point.arrive_and_wait();  // a last look with everything still held
      while (!mine.empty()) release(mine.size() - 1, false);
      for (auto& s : streams) CHECK(cudaStreamSynchronize(s));
      CHECK(cudaEventDestroy(event));
      for (auto& s : streams) CHECK(cudaStreamDestroy(s));
      sync_point.arrive_and_wait();  // everything freed: the shim must hold nothing live
    });
  }
  for (auto& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"threads\":%d,\"streams_per_thread\":%d,\"ops\":%ld,\"allocs\":%ld,\"frees\":%ld,\"hazards\":%ld,"
              "\"checks\":%ld,\"corruptions\":%ld,\"overlaps\":%ld,\"accounting_mismatches\":%ld,\"checkpoints\":%ld,"
              "\"max_live\":%zu,\"host_bytes_first\":%llu,\"host_bytes_last\":%llu,\"host_bytes_max\":%llu,"
              "\"host_bytes_per_peak_live\":%.1f,\"shim\":%s,\"seconds\":%.2f}\n",
              threads, nstreams, g_ops.load(), g_allocs.load(), g_frees.load(), g_hazards.load(), g_checks.load(),
              g_corruptions.load(), overlaps, mismatches, checkpoints, max_live, host_first, host_last, host_max,
              worst_per_live, have_stats ? "true" : "false", seconds);
  return (g_corruptions || overlaps || mismatches) ? 1 : 0;
}
