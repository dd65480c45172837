// dlsym under the shim: RTLD_NEXT and RTLD_DEFAULT keep meaning "relative to the caller", lookups
// on libcuda / libcudart handles give the shim's hooks for the names it hooks (and the real
// functions for the rest), and errors are reported as glibc reports them.
//   argv[1]: the directory holding the test libraries (libe2e_*.so)
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "support/test_support.h"


namespace {

std::string where(void* p) {
  if (p == nullptr) return "null";
  Dl_info info;
  if (dladdr(p, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const char* base = std::strrchr(info.dli_fname, '/');
  return std::string(base ? base + 1 : info.dli_fname) + ":" + (info.dli_sname ? info.dli_sname : "?");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string dir = argv[1];
  // libe2e_next_a (with its dependency libe2e_next_b) in a local scope of its own.
  void* a = dlopen((dir + "/libe2e_next_a.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  auto probe = a ? reinterpret_cast<const char* (*)()>(dlsym(a, "e2e_next_probe")) : nullptr;
  std::printf("{\"next_chain\":\"%s\"", probe ? probe() : "(libe2e_next_a not loaded)");

  // The main program defines no malloc, so the next definition after it is the first one in the
  // global scope: libc's, or a sanitizer runtime's when one is loaded ahead of libc (ASan). A hook
  // resolving RTLD_NEXT relative to itself would skip whatever precedes libgpushim.so.
  void* next_malloc = dlsym(RTLD_NEXT, "malloc");
  std::printf(",\"next_malloc_is_the_first_definition\":%s",
              next_malloc != nullptr && next_malloc == dlsym(RTLD_DEFAULT, "malloc") ? "true" : "false");

  void* user = dlopen((dir + "/libe2e_local_user.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (user == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  auto lookup = reinterpret_cast<int (*)()>(dlsym(user, "e2e_local_lookup"));
  std::printf(",\"default_from_local_scope\":%d", lookup ? lookup() : -2);

  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  void* cudart = dlopen("libcudart.so.13", RTLD_NOW);
  for (const char* name : {"cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2", "cuMemcpy", "cuInit"})
    std::printf(",\"cuda:%s\":\"%s\"", name, where(dlsym(cuda, name)).c_str());
  for (const char* name : {"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaGetDevice"})
    std::printf(",\"cudart:%s\":\"%s\"", name, where(dlsym(cudart, name)).c_str());
  std::printf(",\"default:cudaMalloc\":\"%s\"", where(dlsym(RTLD_DEFAULT, "cudaMalloc")).c_str());

  dlerror();
  void* none = dlsym(cuda, "cuNoSuchFunction");
  const char* err = dlerror();
  std::printf(",\"missing_is_null\":%s,\"missing_sets_dlerror\":%s", none == nullptr ? "true" : "false",
              err != nullptr && std::strstr(err, "cuNoSuchFunction") != nullptr ? "true" : "false");
  dlerror();
  void* hooked = dlsym(cudart, "cudaMalloc");
  std::printf(",\"found_leaves_dlerror_clear\":%s", hooked != nullptr && dlerror() == nullptr ? "true" : "false");

  // Through the handle, an allocation is still seen.
  auto malloc_fn = reinterpret_cast<cudaError_t (*)(void**, size_t)>(hooked);
  void* p = nullptr;
  CHECK(malloc_fn(&p, 1 << 20));
  std::printf("}\n");
  return 0;
}
