#include "stacks/iteration_site.h"

namespace gpushim {

bool starts_new_activation(const SiteActivation& prev, const SiteActivation& cur) {
  if (cur.kind == SiteActivation::kNone) return false;
  if (prev.kind != cur.kind) return true;
  if (cur.kind == SiteActivation::kNative) return cur.position <= prev.position;
  if (cur.frame != prev.frame) return true;
  if (cur.position > prev.position) return false;
  if (cur.nargs != prev.nargs) return true;
  for (int i = 0; i < cur.nargs; ++i)
    if (cur.args[i] != prev.args[i]) return true;
  return false;
}

}  // namespace gpushim
