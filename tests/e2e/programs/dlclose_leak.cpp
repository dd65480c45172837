// A library that allocates and is dlclose'd before exit (a plugin, a ctypes-loaded helper): the
// report must still name it for the frames inside it, from the module table.
//   argv[1]: the directory holding libe2e_dynamic_runtime.so
#include <dlfcn.h>

#include <string>

#include "support/test_support.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  CHECK(cudaSetDevice(0));
  void* lib = dlopen((std::string(argv[1]) + "/libe2e_dynamic_runtime.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  using Allocate = int (*)(size_t, size_t);
  auto allocate = reinterpret_cast<Allocate>(dlsym(lib, "dynamic_runtime_allocate"));
  if (allocate == nullptr || allocate(3 << 20, 1 << 20) != 0) return 3;
  dlclose(lib);
  // Unloaded now (nothing else holds it): dladdr no longer knows its addresses.
  const bool unloaded = dlopen((std::string(argv[1]) + "/libe2e_dynamic_runtime.so").c_str(), RTLD_NOW | RTLD_NOLOAD) == nullptr;
  std::printf("{\"unloaded\": %s}\n", unloaded ? "true" : "false");
  return 0;
}
