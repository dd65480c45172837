// When the preload's core is mapped (interpose/front/): not before the first CUDA call, even after
// the public API was called, and once CUDA was called. Prints one JSON line.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

namespace {

bool core_mapped() {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) found = std::strstr(line, "libgpushim-core.so") != nullptr;
  std::fclose(f);
  return found;
}

}  // namespace

int main() {
  const bool at_start = core_mapped();
  // The public API, looked up as public/gpushim.h says programs should: answers "not active" before
  // any CUDA call, without loading the core.
  using Mark = unsigned long long (*)();
  auto mark = reinterpret_cast<Mark>(dlsym(RTLD_DEFAULT, "gpushim_mark_iteration"));
  const long long marked_before = mark ? static_cast<long long>(mark()) : -1;
  const bool after_api = core_mapped();
  void* p = nullptr;
  const int malloc_rc = cudaMalloc(&p, 1 << 20);
  const bool after_cuda = core_mapped();
  const int free_rc = cudaFree(p);
  const long long marked_after = mark ? static_cast<long long>(mark()) : -1;
  std::printf(
      "{\"at_start\": %s, \"marked_before\": %lld, \"after_api\": %s, \"malloc\": %d, \"after_cuda\": %s, "
      "\"free\": %d, \"marked_after\": %lld}\n",
      at_start ? "true" : "false", marked_before, after_api ? "true" : "false", malloc_rc,
      after_cuda ? "true" : "false", free_rc, marked_after);
  return 0;
}
