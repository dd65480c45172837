// Which allocator PyTorch uses under the shim: the one definition behind GPUSHIM_TORCH_ALLOC, the
// library's constructor (front/torch_routing.cpp) and the launcher's --torch-alloc (which only
// sets GPUSHIM_TORCH_ALLOC). Pure functions of the environment's values: no allocation, no state,
// so the constructor of every preloaded process pays a few getenv calls and nothing else here.
//
//   async (default): PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, unless the user set
//                    PYTORCH_CUDA_ALLOC_CONF or PYTORCH_NO_CUDA_MEMORY_CACHING;
//   no-cache:        PYTORCH_NO_CUDA_MEMORY_CACHING=1, unless the user set it;
//   keep:            nothing.
#pragma once

#include <string>

namespace gpushim {

enum class TorchAlloc { kAsync, kNoCache, kKeep };

inline constexpr const char kTorchAllocVariable[] = "GPUSHIM_TORCH_ALLOC";
inline constexpr const char kTorchAllocConf[] = "PYTORCH_CUDA_ALLOC_CONF";
inline constexpr const char kTorchNoCaching[] = "PYTORCH_NO_CUDA_MEMORY_CACHING";

// GPUSHIM_TORCH_ALLOC's value (null: unset, the default); false for a value it does not take,
// which then routes nothing (the config reports it at the first CUDA call). Case-insensitive,
// surrounding blanks ignored, like every other variable.
bool parse_torch_alloc(const char* value, TorchAlloc* out);

struct TorchRoute {
  const char* name = nullptr;   // the variable to set; null: none
  const char* value = nullptr;
};

// What the choice sets, given the user's own PYTORCH_CUDA_ALLOC_CONF and
// PYTORCH_NO_CUDA_MEMORY_CACHING (null when unset): the user's values always win.
TorchRoute torch_route(TorchAlloc choice, const char* alloc_conf, const char* no_caching);

// Whether these settings leave PyTorch's caching allocator in charge: tensors are then carved out
// of segments the shim sees as a few large allocations.
bool torch_cache_in_charge(const char* alloc_conf, const char* no_caching);

// Why PyTorch's cache stays in charge, for the report ("your PYTORCH_CUDA_ALLOC_CONF=..."); "" when
// it does not.
std::string torch_cache_reason(TorchAlloc choice, const char* alloc_conf, const char* no_caching);

// The constructor's decision: reads the three variables and returns the one torch_route names
// (front/torch_routing.cpp sets it).
TorchRoute torch_route_for_environment();

}  // namespace gpushim
