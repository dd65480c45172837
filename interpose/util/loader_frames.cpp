#include "util/loader_frames.h"

#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <sys/auxv.h>

#include <cstdint>

namespace gpushim {
namespace {

// ld.so's executable segment, from its program headers in memory (AT_BASE is where the kernel
// mapped it): no lock and no file read. False for a static program (no interpreter).
bool loader_text(uintptr_t* begin, uintptr_t* end) {
  const uintptr_t base = getauxval(AT_BASE);
  if (base == 0) return false;
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(base);
  const auto* ph = reinterpret_cast<const ElfW(Phdr)*>(base + eh->e_phoff);
  for (int i = 0; i < eh->e_phnum; ++i) {
    if (ph[i].p_type != PT_LOAD || (ph[i].p_flags & PF_X) == 0) continue;
    *begin = base + ph[i].p_vaddr;
    *end = *begin + ph[i].p_memsz;
    return true;
  }
  return false;
}

}  // namespace

bool called_from_dynamic_loader() {
  uintptr_t begin = 0, end = 0;
  if (!loader_text(&begin, &end)) return false;
  void* frames[256];
  const int n = backtrace(frames, 256);
  for (int i = 0; i < n; ++i) {
    const auto pc = reinterpret_cast<uintptr_t>(frames[i]);
    if (pc >= begin && pc < end) return true;
  }
  return false;
}

}  // namespace gpushim
