// Every path to device memory in one process: the program's own cudaMalloc (dynamic runtime), a
// library linked against libcudart, one calling the driver API directly, and two that carry a
// "static runtime" and reach the driver only through dlopen + cuGetProcAddress (one of them with
// the virtual-memory API). Prints what each part allocated and left live, for the test to compare
// with the report's per-module table.
//   argv[1]: the directory holding the test libraries (libe2e_*.so)
#include <dlfcn.h>

#include <string>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

constexpr size_t kMiB = 1 << 20;

void* load(const std::string& dir, const char* name) {
  void* h = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", name, dlerror());
    std::exit(2);
  }
  return h;
}

template <typename F>
F fn(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (f == nullptr) {
    std::fprintf(stderr, "missing %s\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string dir = argv[1];
  // The program itself.
  void* own = nullptr;
  CHECK(cudaMalloc(&own, 3 * kMiB));

  void* rt = load(dir, "libe2e_dynamic_runtime.so");
  if (fn<int (*)(size_t, size_t)>(rt, "dynamic_runtime_allocate")(5 * kMiB, 1 * kMiB) != 0) return 1;

  void* drv = load(dir, "libe2e_direct_driver.so");
  if (fn<int (*)(size_t, size_t, size_t)>(drv, "direct_driver_allocate")(7 * kMiB, 64 * 1024, 8192) != 0) return 1;

  void* nccl = load(dir, "libe2e_nccl_like.so");
  if (fn<int (*)(size_t, size_t)>(nccl, "nccl_like_allocate")(9 * kMiB, 4 * kMiB) != 0) return 1;
  if (fn<int (*)(size_t)>(nccl, "nccl_like_host_memory")(2 * kMiB) != 0) return 1;

  void* blas = load(dir, "libe2e_blas_like.so");
  if (fn<int (*)(size_t, size_t)>(blas, "blas_like_allocate")(11 * kMiB, 13 * kMiB) != 0) return 1;

  // Asking for the memory figures makes the shim sample the driver's: that sample sees everything.
  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));

  const auto used = testsupport::driver_test_hook<size_t (*)(int)>("fakecudaDeviceUsedBytes");
  std::printf(
      "{\"program\":%zu,\"dynamic_runtime\":%zu,\"direct_driver\":%zu,\"nccl_like\":%zu,\"blas_like\":%zu,"
      "\"managed\":%zu,\"host_direct\":%zu,\"host_nccl\":%zu,\"device_used\":%zu}\n",
      3 * kMiB, 5 * kMiB + 1 * kMiB, 7 * kMiB, 9 * kMiB + 4 * kMiB, 11 * kMiB, size_t{64 * 1024}, size_t{8192},
      2 * kMiB, used ? used(0) : size_t{0});
  return 0;
}
