// When the preload's core is mapped (interpose/front/): not before the first CUDA call, even after
// the public API was called, and once CUDA was called. Prints one JSON line.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "support/test_support.h"

int main() {
  const bool at_start = testsupport::mapped("libgpushim-core.so");
  // The public API, looked up as public/gpushim.h says programs should: answers "not active" before
  // any CUDA call, without loading the core.
  using Mark = unsigned long long (*)();
  auto mark = reinterpret_cast<Mark>(dlsym(RTLD_DEFAULT, "gpushim_mark_iteration"));
  const long long marked_before = mark ? static_cast<long long>(mark()) : -1;
  const bool after_api = testsupport::mapped("libgpushim-core.so");
  void* p = nullptr;
  (void)dlerror();
  const int malloc_rc = cudaMalloc(&p, 1 << 20);
  // The shim's own failed lookups during that first call (a front without its core, say) must not
  // show through the program's next dlerror().
  const bool dlerror_clean = dlerror() == nullptr;
  const bool after_cuda = testsupport::mapped("libgpushim-core.so");
  const int free_rc = cudaFree(p);
  const long long marked_after = mark ? static_cast<long long>(mark()) : -1;
  std::printf(
      "{\"at_start\": %s, \"marked_before\": %lld, \"after_api\": %s, \"malloc\": %d, \"after_cuda\": %s, "
      "\"free\": %d, \"marked_after\": %lld, \"dlerror_clean\": %s}\n",
      at_start ? "true" : "false", marked_before, after_api ? "true" : "false", malloc_rc,
      after_cuda ? "true" : "false", free_rc, marked_after, dlerror_clean ? "true" : "false");
  return 0;
}
