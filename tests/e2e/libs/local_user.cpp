// Loaded with RTLD_LOCAL; its dependency libe2e_local_dep is then in its local scope only.
// dlsym(RTLD_DEFAULT, ...) searches the caller's scope: from here it must find e2e_local_only,
// which a lookup made on behalf of any other object (the shim, say) would not.
#include <dlfcn.h>

extern "C" int e2e_local_only();

extern "C" __attribute__((noinline)) int e2e_local_lookup() {
  auto f = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "e2e_local_only"));
  return f ? f() : -1;
}

// Keeps the dependency a real DT_NEEDED even with --as-needed.
extern "C" int e2e_local_direct() { return e2e_local_only(); }
