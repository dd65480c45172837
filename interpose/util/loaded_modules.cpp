#include "util/loaded_modules.h"
#include "util/dlopen_guard.h"

#include <elf.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace gpushim {

void for_each_loaded_module(absl::FunctionRef<bool(const LoadedModule&)> fn) {
  struct Ctx {
    absl::FunctionRef<bool(const LoadedModule&)>* fn;
  } ctx{&fn};
  const LoaderScope loader_work;  // a fork waits for it (util/dlopen_guard.h)
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) -> int {
        LoadedModule m;
        m.begin = UINTPTR_MAX;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          m.begin = std::min<uintptr_t>(m.begin, info->dlpi_addr + ph.p_vaddr);
          m.end = std::max<uintptr_t>(m.end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        if (m.end <= m.begin) return 0;
        m.name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        m.is_main = m.name[0] == '\0';
        m.bias = info->dlpi_addr;
        m.has_counters = size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs);
        if (m.has_counters) m.adds = info->dlpi_adds, m.subs = info->dlpi_subs;
        m.info = info;
        return (*static_cast<Ctx*>(data)->fn)(m) ? 0 : 1;
      },
      &ctx);
}

bool loaded_module_range(uintptr_t address, uintptr_t* begin, uintptr_t* end) {
  bool found = false;
  for_each_loaded_module([&](const LoadedModule& m) {
    if (address < m.begin || address >= m.end) return true;
    *begin = m.begin;
    *end = m.end;
    found = true;
    return false;
  });
  return found;
}

std::string loaded_module_build_id(const LoadedModule& m) {
  const dl_phdr_info* info = m.info;
  if (info == nullptr) return {};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
    size_t left = ph.p_memsz;
    while (left >= sizeof(ElfW(Nhdr))) {
      ElfW(Nhdr) nh;
      std::memcpy(&nh, p, sizeof(nh));
      const size_t name_len = (nh.n_namesz + 3) & ~size_t{3};
      const size_t desc_len = (nh.n_descsz + 3) & ~size_t{3};
      const size_t total = sizeof(nh) + name_len + desc_len;
      if (total > left) break;
      const char* name = reinterpret_cast<const char*>(p + sizeof(nh));
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0)
        return std::string(reinterpret_cast<const char*>(p + sizeof(nh) + name_len), nh.n_descsz);
      p += total;
      left -= total;
    }
  }
  return {};
}

std::string self_exe_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace gpushim
