#include "config/torch_alloc.h"

#include <string>

namespace gpushim {

std::string torch_cache_reason(TorchAlloc choice, const char* alloc_conf, const char* no_caching) {
  if (!torch_cache_in_charge(alloc_conf, no_caching)) return "";
  if (alloc_conf != nullptr) return std::string("your ") + kTorchAllocConf + "=" + alloc_conf;
  if (choice == TorchAlloc::kKeep) return std::string(kTorchAllocVariable) + "=keep";
  return std::string(kTorchAllocConf) + " unset";  // not preloaded at start-up, or a child that unset it
}

}  // namespace gpushim
