// PyTorch's allocator chosen by the preload itself (config/torch_alloc.h, docs/python.md): a
// preloaded library's initializer runs before the program's main, usually while the process has
// one thread (environment.cpp says what it does otherwise), and before an interpreter copies the
// environment into os.environ, so `python train.py` under LD_PRELOAD sees PYTORCH_CUDA_ALLOC_CONF
// as if the user had exported it (and so do its children, which inherit the environment and the
// preload). A process that never touches CUDA pays three getenv calls, a dladdr and at most one
// variable added to the environment (no malloc: environment.cpp); programs that are not PyTorch
// ignore the variable.

#include <cstdlib>
#include <cstring>

#include "config/torch_alloc.h"
#include "front/front.h"

namespace {

// Only a library loaded at startup may call setenv: one dlopen'ed later (by a program that already
// runs threads) would race their getenv. Preloaded means named in LD_PRELOAD, by its file name.
bool preloaded() {
  const char* preload = getenv("LD_PRELOAD");
  if (preload == nullptr || *preload == '\0') return false;
  const char* self = gpushim::front::own_file_name();  // the path the loader gave this library
  if (self == nullptr) return false;
  const char* slash = strrchr(self, '/');
  const char* name = slash ? slash + 1 : self;
  const size_t len = strlen(name);
  if (len == 0) return false;
  for (const char* at = strstr(preload, name); at != nullptr; at = strstr(at + 1, name)) {
    const char end = at[len];
    const bool starts_entry = at == preload || at[-1] == '/' || at[-1] == ':' || at[-1] == ' ';
    if (starts_entry && (end == '\0' || end == ':' || end == ' ')) return true;
  }
  return false;
}

}  // namespace

void gpushim::front::route_torch_allocator() {
  if (!preloaded()) return;
  const gpushim::TorchRoute route = gpushim::torch_route_for_environment();
  if (route.name != nullptr) gpushim::front::add_to_environment(route.name, route.value);
}
