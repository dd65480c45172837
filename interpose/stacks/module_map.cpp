#include "stacks/module_map.h"

#include <algorithm>
#include <string_view>

#include "util/loaded_modules.h"
#include "util/paths.h"

namespace gpushim {
namespace {

// Where this library itself is loaded: the shim is plumbing whatever its file is called.
void own_anchor() {}

bool is_plumbing_path(std::string_view path, bool contains_self) {
  if (contains_self) return true;
  const std::string_view b = base_name(path);
  return b.starts_with("libcudart.so") || b.starts_with("libcuda.so");
}

}  // namespace

ModuleMap::ModuleMap() : names_(1), exe_(self_exe_path()) { names_.reserve(64); }

ModuleMap::~ModuleMap() {
  delete current_.load(std::memory_order_acquire);
  for (const Snapshot* s : retired_) delete s;
}

const ModuleMap::Range* ModuleMap::find_range(const Snapshot& s, uintptr_t address) {
  auto it = std::upper_bound(s.ranges.begin(), s.ranges.end(), address,
                             [](uintptr_t a, const Range& r) { return a < r.begin; });
  if (it == s.ranges.begin()) return nullptr;
  --it;
  return address < it->end ? &*it : nullptr;
}

ModuleId ModuleMap::find(const Snapshot& s, uintptr_t address) {
  const Range* r = find_range(s, address);
  return r ? r->id : kUnknownModule;
}

ModuleId ModuleMap::lookup(uintptr_t address) {
  const Snapshot* s = current_.load(std::memory_order_acquire);
  if (s != nullptr) {
    const ModuleId id = find(*s, address);
    if (id != kUnknownModule) return id;
  }
  std::lock_guard<std::mutex> lock(mu_);
  rebuild();
  s = current_.load(std::memory_order_acquire);
  return s ? find(*s, address) : kUnknownModule;
}

ModuleId ModuleMap::intern(const std::string& path, bool plumbing) {
  if (auto it = ids_.find(path); it != ids_.end()) return it->second;
  if (names_.size() >= kMaxModules) return kUnknownModule;
  const size_t id = names_.size();
  names_.push_back(path);
  ids_.emplace(path, static_cast<ModuleId>(id));
  plumbing_[id].store(plumbing ? 1 : 0, std::memory_order_relaxed);
  count_.store(names_.size(), std::memory_order_release);
  return static_cast<ModuleId>(id);
}

void ModuleMap::rebuild() {
  const Snapshot* old = current_.load(std::memory_order_acquire);
  Snapshot* fresh = nullptr;
  bool unchanged = false;
  const uintptr_t self = reinterpret_cast<uintptr_t>(&own_anchor);
  for_each_loaded_module([&](const LoadedModule& m) {
    if (fresh == nullptr) {
      // First object: the counters tell whether anything changed since the last snapshot.
      if (old && m.has_counters && m.adds == old->adds && m.subs == old->subs) {
        unchanged = true;
        return false;
      }
      fresh = new Snapshot;
      if (m.has_counters) fresh->adds = m.adds, fresh->subs = m.subs;
    }
    const std::string path = m.is_main ? exe_ : std::string(m.name);
    if (path.empty()) return true;  // e.g. the vDSO under some loaders
    const ModuleId id = intern(path, is_plumbing_path(path, self >= m.begin && self < m.end));
    if (id != kUnknownModule) fresh->ranges.push_back({m.begin, m.end, id, m.bias});
    return true;
  });
  if (unchanged || fresh == nullptr) return;
  std::sort(fresh->ranges.begin(), fresh->ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  current_.store(fresh, std::memory_order_release);
  if (old != nullptr) retired_.push_back(old);  // stays readable by anyone still on it
}

ModuleMap::View ModuleMap::view() {
  std::lock_guard<std::mutex> lock(mu_);
  rebuild();
  return View{current_.load(std::memory_order_acquire), retired_.size()};
}

bool ModuleMap::describe_unloaded(const View& v, uintptr_t address, std::string* path, uintptr_t* base) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (v.snapshot != nullptr && find(*static_cast<const Snapshot*>(v.snapshot), address) != kUnknownModule) return false;
  for (size_t i = std::min(v.retired, retired_.size()); i-- > 0;) {  // newest first: addresses get reused
    const Range* r = find_range(*retired_[i], address);
    if (r == nullptr) continue;
    *path = r->id < names_.size() ? names_[r->id] : std::string();
    *base = r->base;
    return !path->empty();
  }
  return false;
}

std::string ModuleMap::name(ModuleId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return id < names_.size() ? names_[id] : std::string();
}

bool ModuleMap::is_cuda_plumbing(ModuleId id) const {
  return id != kUnknownModule && id < count_.load(std::memory_order_acquire) &&
         plumbing_[id].load(std::memory_order_relaxed) != 0;
}

}  // namespace gpushim
