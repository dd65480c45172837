#include "stacks/site_identity.h"

#include "stacks/frame_roles.h"

namespace gpushim {

std::string site_identity(int device, std::string_view kind, const std::vector<FrameInfo>& frames) {
  std::string id = std::to_string(device);
  id += '|';
  id += kind;
  for (const FrameInfo& f : frames) {
    const size_t slash = f.module.find_last_of('/');
    id += '|';
    id += slash == std::string::npos ? f.module : f.module.substr(slash + 1);
    // A C runtime frame's line depends on the machine (libc6-dbg installed or not) and on the
    // shim's version (named only since 2026-11-29): the same site, with or without it.
    if (c_runtime_module(f.module))
      id += '|' + f.function + "|:0";
    else
      id += '|' + f.function + '|' + f.file + ':' + std::to_string(f.line);
    if (f.function.empty() && f.file.empty() && !f.python) id += '@' + std::to_string(f.module_offset);
  }
  return id;
}

}  // namespace gpushim
