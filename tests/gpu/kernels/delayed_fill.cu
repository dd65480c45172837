// libgpushim_testkernels.so: the delayed-fill "kernel" of the simulated device, for real GPUs.
//
// The e2e programs prove safe reuse by launching a slow kernel that writes into a block, freeing
// the block, and checking that the next owner's data is never overwritten
// (tests/e2e/programs/support/test_support.h). The simulated device exports
// fakecudaLaunchDelayedFill; on a GPU the programs dlopen this library and call the same name with
// the same contract: in stream order, wait `delay_us`, then set `bytes` bytes at `dst` to `value`.
#include <cuda_runtime.h>

namespace {

// One thread spins on the global nanosecond timer: the stream is busy for `ns`, like a slow kernel.
__global__ void spin_for(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int fakecudaLaunchDelayedFill(void* dst, int value, size_t bytes,
                                                                                unsigned delay_us, cudaStream_t stream) {
  spin_for<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(delay_us) * 1000ull);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  // The fill itself is a memset queued behind the spin: CUDA checks that [dst, dst+bytes) is
  // device memory, as the simulated device does.
  return cudaMemsetAsync(dst, value, bytes, stream);
}

// Loads this library's kernels now (test_support.h calls it once, before any stream is held): under
// CUDA's lazy loading a kernel's first launch may wait for the context, and so for a held stream.
extern "C" __attribute__((visibility("default"))) int gpushimTestKernelsLoad() {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return cudaGetLastError();
  spin_for<<<1, 1, 0, s>>>(0);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t done = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return launched != cudaSuccess ? launched : done;
}
