// The price of the driver-path interception, measured on the simulated device: run this binary
// once plain and once with LD_PRELOAD=libgpushim.so (GPUSHIM_POLICY=passthrough, so the shim only
// accounts) and compare. Covers a direct driver allocation (JAX/TF), one obtained through
// cuGetProcAddress (static runtimes), the dynamic runtime's cudaMalloc (which now passes through a
// driver hook underneath), and cuGetProcAddress itself (libcudart asks it ~440 times at startup).
//
//   LD_LIBRARY_PATH=build/fakecuda build/bin/gpushim_bench_driver_hooks
//   LD_LIBRARY_PATH=build/fakecuda LD_PRELOAD=build/lib/libgpushim.so GPUSHIM_POLICY=passthrough
//     GPUSHIM_REPORT=off GPUSHIM_SUMMARY=0 build/bin/gpushim_bench_driver_hooks   (one line)
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>

namespace {

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

GetProcV2 get_proc() {
  static GetProcV2 fn = reinterpret_cast<GetProcV2>(dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuGetProcAddress_v2"));
  return fn;
}

void init() {
  static bool done = [] {
    if (cudaFree(nullptr) != cudaSuccess) std::abort();  // context current on this thread
    return true;
  }();
  (void)done;
}

void BM_cuMemAllocFree_Direct(benchmark::State& state) {
  init();
  for (auto _ : state) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) state.SkipWithError("driver");
  }
}
BENCHMARK(BM_cuMemAllocFree_Direct);

void BM_cuMemAllocFree_ThroughGetProcAddress(benchmark::State& state) {
  init();
  void* a = nullptr;
  void* f = nullptr;
  get_proc()("cuMemAlloc", &a, 3020, 0, nullptr);
  get_proc()("cuMemFree", &f, 3020, 0, nullptr);
  auto alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(a);
  auto free_fn = reinterpret_cast<decltype(&cuMemFree_v2)>(f);
  for (auto _ : state) {
    CUdeviceptr p = 0;
    if (alloc(&p, 1 << 20) != CUDA_SUCCESS || free_fn(p) != CUDA_SUCCESS) state.SkipWithError("driver");
  }
}
BENCHMARK(BM_cuMemAllocFree_ThroughGetProcAddress);

void BM_cudaMallocFree_Runtime(benchmark::State& state) {
  init();
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaMalloc(&p, 1 << 20) != cudaSuccess || cudaFree(p) != cudaSuccess) state.SkipWithError("runtime");
  }
}
BENCHMARK(BM_cudaMallocFree_Runtime);

void BM_cuGetProcAddress(benchmark::State& state) {
  init();
  const char* names[] = {"cuMemAlloc", "cuMemcpy", "cuStreamCreate", "cuMemAllocAsync"};
  size_t i = 0;
  for (auto _ : state) {
    void* p = nullptr;
    get_proc()(names[i++ % 4], &p, 12000, 0, nullptr);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_cuGetProcAddress);

void BM_dlsym_LibcudaHandle(benchmark::State& state) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  const char* names[] = {"cuMemAlloc_v2", "cuMemcpy"};
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(dlsym(h, names[i++ % 2]));
}
BENCHMARK(BM_dlsym_LibcudaHandle);

}  // namespace

BENCHMARK_MAIN();
