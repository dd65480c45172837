#include "util/loader_frames.h"

#include <execinfo.h>
#include <sys/auxv.h>

#include <cstdint>

#include "util/loaded_modules.h"

namespace gpushim {

bool called_from_dynamic_loader() {
  // ld.so's span, the module that holds the address the kernel loaded it at (AT_BASE; 0 for a
  // static program, which has no loader to be inside of).
  const uintptr_t loader = getauxval(AT_BASE);
  uintptr_t begin = 0, end = 0;
  if (loader == 0 || !loaded_module_range(loader, &begin, &end)) return false;
  void* frames[256];
  const int n = backtrace(frames, 256);
  for (int i = 0; i < n; ++i) {
    const auto pc = reinterpret_cast<uintptr_t>(frames[i]);
    if (pc >= begin && pc < end) return true;
  }
  return false;
}

}  // namespace gpushim
