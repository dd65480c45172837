// The core's side of the contract with the preload front (front/front_api.h): the two functions the
// front looks up on the handle it dlopened.
#include "core/shim.h"
#include "cuda/real_symbols.h"
#include "front/front_api.h"
#include "hooks/export.h"
#include "hooks/substitution.h"
#include "util/thread_block.h"

static_assert(gpushim::kThreadBlockBytes <= kGpushimFrontThreadBlockBytes, "the front lends the core too small a block");

GPUSHIM_EXPORT int gpushim_core_attach(const GpushimFront* front) {
  if (front == nullptr || front->size < sizeof(GpushimFront)) return -1;
  gpushim::attach_front(front);
  gpushim::Shim::install_fork_handlers();
  return 0;
}

GPUSHIM_EXPORT void* gpushim_core_substitute(const char* name, void* found) {
  return gpushim::substitute_by_name(name, found);
}
