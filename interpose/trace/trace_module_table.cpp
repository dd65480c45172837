#include "trace/trace_module_table.h"

#include <algorithm>
#include <string>

#include "util/loaded_modules.h"

namespace gpushim::trace {

const ModuleInfo* TraceModuleTable::lookup(uint64_t addr) const {
  auto it = std::upper_bound(modules_.begin(), modules_.end(), addr,
                             [](uint64_t a, const ModuleInfo& m) { return a < m.begin; });
  if (it == modules_.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

const ModuleInfo* TraceModuleTable::find(uint64_t addr, uint64_t refresh_token) {
  if (const ModuleInfo* m = lookup(addr)) return m;
  if (refresh_token == last_refresh_token_) return nullptr;
  last_refresh_token_ = refresh_token;
  refresh();
  return lookup(addr);
}

std::vector<ModuleInfo> TraceModuleTable::take_new() {
  std::vector<ModuleInfo> out;
  out.swap(fresh_);
  return out;
}

void TraceModuleTable::refresh() {
  struct Found {
    std::string path;
    uint64_t bias, begin, end;
    std::string build_id;
  };
  std::vector<Found> found;
  for_each_loaded_module([&](const LoadedModule& m) {
    found.push_back(Found{m.name, m.bias, m.begin, m.end, loaded_module_build_id(m)});
    return true;
  });
  for (Found& f : found) {
    // glibc names the main program "" (or argv[0]); offline tools need the real file.
    if (f.path.empty()) f.path = self_exe_path();
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
