// Behaves like a cuBLAS built for per-thread default streams with an older static runtime: it
// takes the 4-argument cuGetProcAddress (CUDA 11.3's) from the driver, and stream-ordered
// allocation through it with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, i.e. the _ptsz
// variants, on stream 0 (which then means the per-thread default stream).
#include "static_runtime_support.h"

using namespace staticrt;

namespace {

using AllocAsync = decltype(&cuMemAllocAsync);
using FreeAsync = decltype(&cuMemFreeAsync);
using Sync = decltype(&cuStreamSynchronize);

struct Api {
  GetProcV1 get_proc = resolve<GetProcV1>("cuGetProcAddress", 11030);
  template <typename F>
  F per_thread(const char* name, int version) {
    void* p = nullptr;
    STATICRT_CHECK(get_proc(name, &p, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
    return reinterpret_cast<F>(p);
  }
  AllocAsync alloc = per_thread<AllocAsync>("cuMemAllocAsync", 11020);
  FreeAsync free = per_thread<FreeAsync>("cuMemFreeAsync", 11020);
  Sync sync = per_thread<Sync>("cuStreamSynchronize", 2000);
};

const Api& api() {
  static const Api a;
  return a;
}

}  // namespace

// Workspace that stays allocated: `keep` bytes. A temporary of `scratch` bytes is freed again.
extern "C" int blas_like_allocate(size_t keep, size_t scratch) {
  const Api& a = api();
  CUdeviceptr workspace = 0, tmp = 0;
  STATICRT_CHECK(a.alloc(&workspace, keep, nullptr));
  STATICRT_CHECK(a.alloc(&tmp, scratch, nullptr));
  STATICRT_CHECK(a.free(tmp, nullptr));
  STATICRT_CHECK(a.sync(nullptr));
  return 0;
}
