// A CUDA program in the style of NVIDIA's samples, built by nvcc twice (tests/e2e/CMakeLists.txt):
// `kernels` with nvcc's default static runtime, `kernels_shared` with -cudart shared. Device query,
// allocations, kernels on two streams ordered by an event, copies back, launch errors, function
// attributes and occupancy, frees, and one deliberate leak (leak_one_mebibyte) for the report.
// Every result is checked; the first failure prints "FAILED <what>: <error name> (<code>)" and
// exits 2; success prints "OK".
//
// On a GPU the kernels run. On the simulated device (tests/fakecuda) a kernel runs as a host
// function registered for its name with fakecudaSetKernelStandIn, found with dlsym so that the same
// binary runs unchanged on NVIDIA's libraries; NVIDIA's static runtime stops at its integrity check
// there (docs/interception.md).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

#define CHECK(call)                                                                               \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess) {                                                                    \
      std::printf("FAILED %s: %s (%d)\n", #call, cudaGetErrorName(err_), static_cast<int>(err_)); \
      return 2;                                                                                   \
    }                                                                                             \
  } while (0)

#define EXPECT(cond)                          \
  do {                                        \
    if (!(cond)) {                            \
      std::printf("FAILED %s\n", #cond);      \
      return 2;                               \
    }                                         \
  } while (0)

extern "C" __global__ void fill_pattern(unsigned* out, unsigned seed, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = seed ^ static_cast<unsigned>(i);
}

extern "C" __global__ void add_arrays(unsigned* out, const unsigned* a, const unsigned* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

// A kernel that is still writing when the program frees its buffer: cudaFree waits for it, so
// memory handed out again afterwards never sees its writes (the delayed-fill integrity check).
extern "C" __global__ void slow_fill(unsigned* out, unsigned value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

// ---- stand-ins for the simulated device: the same computations on the host ----
struct LaunchDims {
  unsigned grid[3];
  unsigned block[3];
  size_t shared_bytes;
};

static void fill_pattern_on_host(void** args, const LaunchDims*, void*) {
  unsigned* out = *static_cast<unsigned**>(args[0]);
  unsigned seed = *static_cast<unsigned*>(args[1]);
  int n = *static_cast<int*>(args[2]);
  for (int i = 0; i < n; ++i) out[i] = seed ^ static_cast<unsigned>(i);
}

static void add_arrays_on_host(void** args, const LaunchDims*, void*) {
  unsigned* out = *static_cast<unsigned**>(args[0]);
  const unsigned* a = *static_cast<const unsigned**>(args[1]);
  const unsigned* b = *static_cast<const unsigned**>(args[2]);
  int n = *static_cast<int*>(args[3]);
  for (int i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

static void slow_fill_on_host(void** args, const LaunchDims*, void*) {
  usleep(20000);  // a long kernel: the host has long returned from the launch
  unsigned* out = *static_cast<unsigned**>(args[0]);
  unsigned value = *static_cast<unsigned*>(args[1]);
  int n = *static_cast<int*>(args[2]);
  for (int i = 0; i < n; ++i) out[i] = value;
}

static void register_stand_ins() {
  using SetStandIn = int (*)(const char*, void (*)(void**, const LaunchDims*, void*), void*, const size_t*, int);
  auto set = reinterpret_cast<SetStandIn>(dlsym(RTLD_DEFAULT, "fakecudaSetKernelStandIn"));
  if (set == nullptr) return;  // NVIDIA's runtime: the kernels themselves run
  const size_t fill_args[] = {sizeof(unsigned*), sizeof(unsigned), sizeof(int)};
  const size_t add_args[] = {sizeof(unsigned*), sizeof(const unsigned*), sizeof(const unsigned*), sizeof(int)};
  set("fill_pattern", fill_pattern_on_host, nullptr, fill_args, 3);
  set("add_arrays", add_arrays_on_host, nullptr, add_args, 4);
  set("slow_fill", slow_fill_on_host, nullptr, fill_args, 3);
}

__attribute__((noinline)) static void* leak_one_mebibyte() {
  void* p = nullptr;
  return cudaMalloc(&p, 1 << 20) == cudaSuccess ? p : nullptr;
}

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count >= 1);
  register_stand_ins();
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  EXPECT(prop.maxThreadsPerBlock >= 1024 && prop.maxThreadsPerMultiProcessor > 0 && prop.sharedMemPerBlock > 0);

  const int n = 1 << 16;
  const size_t bytes = n * sizeof(unsigned);
  unsigned *a = nullptr, *b = nullptr, *sum = nullptr, *host = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&sum, bytes));
  CHECK(cudaMallocHost(&host, bytes));
  cudaStream_t producer, consumer;
  CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  cudaEvent_t filled;
  CHECK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));

  // Producer: memset then two fills; consumer waits for them through the event, then adds.
  CHECK(cudaMemsetAsync(a, 0xff, bytes, producer));
  const unsigned blocks = (n + 255) / 256;
  fill_pattern<<<blocks, 256, 0, producer>>>(a, 0x1234u, n);
  CHECK(cudaGetLastError());
  fill_pattern<<<blocks, 256, 0, producer>>>(b, 0xabcd0000u, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(filled, producer));
  CHECK(cudaStreamWaitEvent(consumer, filled, 0));
  void* args[] = {&sum, &a, &b, const_cast<int*>(&n)};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(add_arrays), dim3(blocks), dim3(256), args, 0, consumer));
  CHECK(cudaMemcpyAsync(host, sum, bytes, cudaMemcpyDeviceToHost, consumer));
  CHECK(cudaStreamSynchronize(consumer));
  for (int i = 0; i < n; ++i) {
    const unsigned want = (0x1234u ^ static_cast<unsigned>(i)) + (0xabcd0000u ^ static_cast<unsigned>(i));
    if (host[i] != want) {
      std::printf("FAILED kernel result: sum[%d] = %#x, want %#x\n", i, host[i], want);
      return 2;
    }
  }

  // Launch errors are reported by the launch and by cudaGetLastError, which then resets.
  fill_pattern<<<1, 2048, 0, producer>>>(a, 0, n);
  EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
  EXPECT(cudaGetLastError() == cudaSuccess);
  EXPECT(cudaLaunchKernel(reinterpret_cast<const void*>(&main), dim3(1), dim3(1), nullptr, 0, nullptr) ==
         cudaErrorInvalidDeviceFunction);
  EXPECT(cudaGetLastError() == cudaErrorInvalidDeviceFunction);

  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(fill_pattern)));
  EXPECT(attr.maxThreadsPerBlock == 1024);
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fill_pattern, 256, 0));
  EXPECT(per_sm >= 1 && per_sm <= prop.maxThreadsPerMultiProcessor / 256);
  int min_grid = 0, block_size = 0;  // the header's template over the occupancy and attribute calls
  CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block_size, fill_pattern, 0, 0));
  EXPECT(block_size >= 32 && block_size <= 1024 && min_grid >= prop.multiProcessorCount);

  // Free while a kernel still writes; the next allocation of that size (a pool hands back the same
  // block) must not see the late writes.
  unsigned* busy = nullptr;
  CHECK(cudaMalloc(&busy, bytes));
  slow_fill<<<blocks, 256, 0, producer>>>(busy, 0xdeadbeefu, n);
  CHECK(cudaGetLastError());
  CHECK(cudaFree(busy));
  unsigned* fresh = nullptr;
  CHECK(cudaMalloc(&fresh, bytes));
  CHECK(cudaMemset(fresh, 0, bytes));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(host, fresh, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (host[i] != 0) {
      std::printf("FAILED reuse after free: fresh[%d] = %#x, a freed kernel's write landed in it\n", i, host[i]);
      return 2;
    }
  }
  CHECK(cudaFree(fresh));

  EXPECT(leak_one_mebibyte() != nullptr);
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(sum));
  CHECK(cudaFree(b));
  CHECK(cudaFree(a));
  CHECK(cudaEventDestroy(filled));
  CHECK(cudaStreamDestroy(consumer));
  CHECK(cudaStreamDestroy(producer));
  std::printf("OK\n");
  return 0;
}
