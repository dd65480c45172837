#include "trace/module_map.h"

#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace gpushim::trace {
namespace {

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// NT_GNU_BUILD_ID from the object's PT_NOTE segments, read from memory: identifies the exact
// file, so offline symbolization can tell a rebuilt binary from the one that ran.
std::string build_id(const dl_phdr_info* info) {
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

}  // namespace

const ModuleInfo* ModuleMap::lookup(uint64_t addr) const {
  auto it = std::upper_bound(modules_.begin(), modules_.end(), addr,
                             [](uint64_t a, const ModuleInfo& m) { return a < m.begin; });
  if (it == modules_.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

const ModuleInfo* ModuleMap::find(uint64_t addr, uint64_t refresh_token) {
  if (const ModuleInfo* m = lookup(addr)) return m;
  if (refresh_token == last_refresh_token_) return nullptr;
  last_refresh_token_ = refresh_token;
  refresh();
  return lookup(addr);
}

std::vector<ModuleInfo> ModuleMap::take_new() {
  std::vector<ModuleInfo> out;
  out.swap(fresh_);
  return out;
}

void ModuleMap::refresh() {
  struct Found {
    std::string path;
    uint64_t bias, begin, end;
    std::string build_id;
  };
  std::vector<Found> found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        uint64_t begin = UINT64_MAX, end = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          begin = std::min<uint64_t>(begin, info->dlpi_addr + ph.p_vaddr);
          end = std::max<uint64_t>(end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        if (end <= begin) return 0;
        const char* name = info->dlpi_name ? info->dlpi_name : "";
        static_cast<std::vector<Found>*>(data)->push_back(
            Found{name, info->dlpi_addr, begin, end, build_id(info)});
        return 0;
      },
      &found);
  for (Found& f : found) {
    // glibc names the main program "" (or argv[0]); offline tools need the real file.
    if (f.path.empty()) f.path = self_exe();
    const ModuleInfo* known = lookup(f.begin);
    if (known && known->begin == f.begin && known->end == f.end && known->path == f.path) continue;
    // Something else now sits there (a dlclose, then a dlopen): the old entry stops resolving.
    modules_.erase(std::remove_if(modules_.begin(), modules_.end(),
                                  [&](const ModuleInfo& m) { return m.begin < f.end && f.begin < m.end; }),
                   modules_.end());
    ModuleInfo m;
    m.id = next_id_++;
    m.path = std::move(f.path);
    m.bias = f.bias;
    m.begin = f.begin;
    m.end = f.end;
    m.build_id = std::move(f.build_id);
    fresh_.push_back(m);
    modules_.insert(std::upper_bound(modules_.begin(), modules_.end(), m.begin,
                                     [](uint64_t a, const ModuleInfo& x) { return a < x.begin; }),
                    std::move(m));
  }
}

}  // namespace gpushim::trace
