#include "core/call_context.h"

#include "core/shim.h"

namespace gpushim {

CallScope::~CallScope() {
  if (api_ == HookApi::kRuntime) --frame_.runtime_depth;
  if (frame_.depth != 1) {
    --frame_.depth;
    return;
  }
  frame_.caller = 0;
  // The allocation or free is complete: a good moment to ask the driver what it sees. Still
  // counted as inside the hook meanwhile (may_hold_shim_locks()): the sample takes the shim's locks.
  if (Shim* s = Shim::existing()) s->after_hook();
  frame_.depth = 0;
}

}  // namespace gpushim
