// What makes two allocations the same site, in the exit report and in gpushim-analyze alike:
// the device, the memory kind and every frame of the stack, native and Python, as symbolized.
// Raw addresses never take part (they change with ASLR and between runs), nor a module's
// directory (the same library installed elsewhere is the same code); a native frame with neither
// a function nor a file is told apart by its offset in its module. Stacks that symbolize alike
// (two return addresses on one line, or the same Python line reached by different interpreter
// frames) are one site to a reader, so they are merged under this identity.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "stacks/symbolizer.h"

namespace gpushim {

std::string site_identity(int device, std::string_view kind, const std::vector<FrameInfo>& frames);

}  // namespace gpushim
