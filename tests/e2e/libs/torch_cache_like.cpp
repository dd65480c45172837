// Stands in for PyTorch's libc10_cuda.so (built under that file name, build/e2e-libs/libc10_cuda.so)
// with its caching allocator in charge: tensors are carved out of 20 MiB segments it asks CUDA for,
// and a segment is never given back. A Python program reaches it through ctypes, as PyTorch's
// tensors reach the real one.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::Native {

constexpr size_t kSegment = 20u << 20;

struct DeviceCachingAllocator {
  std::vector<char*> segments;
  size_t used_in_last = kSegment;

  // Bump allocation inside the current segment; a new segment when it is full.
  __attribute__((noinline)) void* malloc(size_t n) {
    n = (n + 511) & ~static_cast<size_t>(511);
    if (n > kSegment) return nullptr;
    if (used_in_last + n > kSegment) {
      void* seg = nullptr;
      if (cudaMalloc(&seg, kSegment) != cudaSuccess) return nullptr;
      segments.push_back(static_cast<char*>(seg));
      used_in_last = 0;
    }
    char* p = segments.back() + used_in_last;
    used_in_last += n;
    return p;
  }
};

DeviceCachingAllocator g_allocator;

}  // namespace c10::cuda::CUDACachingAllocator::Native

extern "C" void* c10_cuda_empty(size_t n) { return c10::cuda::CUDACachingAllocator::Native::g_allocator.malloc(n); }
