// The libc-only half of config/torch_alloc.h: also compiled into the preload front (front/), which
// runs route_torch_allocator in its constructor and links no C++ runtime (interpose/CMakeLists.txt).
#include "config/torch_alloc.h"

#include <cstdlib>
#include <cstring>
#include <strings.h>

namespace gpushim {

bool parse_torch_alloc(const char* value, TorchAlloc* out) {
  if (value == nullptr) return *out = TorchAlloc::kAsync, true;
  while (*value == ' ' || *value == '\t') ++value;
  size_t n = strlen(value);
  while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t')) --n;
  auto is = [&](const char* word) { return n == strlen(word) && strncasecmp(value, word, n) == 0; };
  if (is("async")) return *out = TorchAlloc::kAsync, true;
  if (is("no-cache")) return *out = TorchAlloc::kNoCache, true;
  if (is("keep")) return *out = TorchAlloc::kKeep, true;
  return false;
}

TorchRoute torch_route(TorchAlloc choice, const char* alloc_conf, const char* no_caching) {
  switch (choice) {
    case TorchAlloc::kAsync:
      if (alloc_conf == nullptr && no_caching == nullptr) return {kTorchAllocConf, "backend:cudaMallocAsync"};
      return {};
    case TorchAlloc::kNoCache:
      if (no_caching == nullptr) return {kTorchNoCaching, "1"};
      return {};
    case TorchAlloc::kKeep: return {};
  }
  return {};
}

bool torch_cache_in_charge(const char* alloc_conf, const char* no_caching) {
  // PyTorch turns its cache off for PYTORCH_NO_CUDA_MEMORY_CACHING set to anything.
  if (no_caching != nullptr) return false;
  return alloc_conf == nullptr || strstr(alloc_conf, "cudaMallocAsync") == nullptr;
}

TorchRoute torch_route_for_environment() {
  TorchAlloc choice;
  if (!parse_torch_alloc(getenv(kTorchAllocVariable), &choice)) return {};
  return torch_route(choice, getenv(kTorchAllocConf), getenv(kTorchNoCaching));
}

}  // namespace gpushim
