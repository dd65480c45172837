// dlsym under the shim: RTLD_NEXT and RTLD_DEFAULT keep meaning "relative to the caller", lookups
// on libcuda / libcudart handles give the shim's hooks for the names it hooks (and the real
// functions for the rest), and errors are reported as glibc reports them.
//   argv[1]: the directory holding the test libraries (libe2e_*.so)
#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.h"


namespace {

std::string where(void* p) {
  if (p == nullptr) return "null";
  Dl_info info;
  if (dladdr(p, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const char* base = std::strrchr(info.dli_fname, '/');
  return std::string(base ? base + 1 : info.dli_fname) + ":" + (info.dli_sname ? info.dli_sname : "?");
}

// The first object after the main program, in load order (the order of the global scope for the
// objects loaded at start-up), that defines `name` itself, and its definition. Not simply
// RTLD_DEFAULT's answer: the program may define it too (TSan links its runtime into it).
void* first_definition_after_the_program(const char* name) {
  std::vector<std::string> objects;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name ? info->dlpi_name : "");
        return 0;
      },
      &objects);
  for (size_t i = 1; i < objects.size(); ++i) {  // 0 is the program
    void* h = dlopen(objects[i].c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) continue;  // the vDSO
    void* f = dlsym(h, name);    // this object first, then its dependencies
    Dl_info info;
    const bool own = f != nullptr && dladdr(f, &info) != 0 && info.dli_fname != nullptr && objects[i] == info.dli_fname;
    dlclose(h);
    if (own) return f;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string dir = argv[1];
  // libe2e_next_a (with its dependency libe2e_next_b) in a local scope of its own.
  void* a = dlopen((dir + "/libe2e_next_a.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  auto probe = a ? reinterpret_cast<const char* (*)()>(dlsym(a, "e2e_next_probe")) : nullptr;
  std::printf("{\"next_chain\":\"%s\"", probe ? probe() : "(libe2e_next_a not loaded)");

  // RTLD_NEXT from the program: the first malloc defined after it (libc's; a sanitizer runtime's
  // when one is preloaded ahead of libc, as under ASan). A hook resolving RTLD_NEXT relative to
  // itself would skip whatever precedes libgpushim.so.
  void* next_malloc = dlsym(RTLD_NEXT, "malloc");
  void* expected = first_definition_after_the_program("malloc");
  std::printf(",\"next_malloc_is_the_first_after_the_program\":%s",
              next_malloc != nullptr && next_malloc == expected ? "true" : "false");

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
