// N threads allocate and free random sizes concurrently and keep some blocks live. At the end the
// program prints what it holds (JSON on stdout), so the test can compare with the report exactly.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 8;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::atomic<unsigned long long> live_bytes{0}, live_count{0}, allocs{0}, frees{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<std::pair<void*, size_t>> held;
      for (int i = 0; i < iterations; ++i) {
        if (!held.empty() && rng() % 2 == 0) {
          const size_t k = rng() % held.size();
          if (cudaFree(held[k].first) != cudaSuccess) errors++;
          frees++;
          held[k] = held.back();
          held.pop_back();
        } else {
          const size_t size = 1 + rng() % (1 << 20);
          void* p = nullptr;
          if (cudaMalloc(&p, size) != cudaSuccess) {
            errors++;
            continue;
          }
          allocs++;
          held.emplace_back(p, size);
        }
      }
      // Keep every third block live at exit; free the rest.
      for (size_t k = 0; k < held.size(); ++k) {
        if (k % 3 == 0) {
          live_bytes += held[k].second;
          live_count++;
        } else {
          if (cudaFree(held[k].first) != cudaSuccess) errors++;
          frees++;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("{\"live_requested_bytes\":%llu,\"live_count\":%llu,\"allocs\":%llu,\"frees\":%llu,\"errors\":%d}\n",
              live_bytes.load(), live_count.load(), allocs.load(), frees.load(), errors.load());
  return errors.load() ? 1 : 0;
}
