#include "stacks/module_map.h"

#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>

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

std::string read_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

ModuleMap::ModuleMap() : names_(1), exe_(read_exe()) { names_.reserve(64); }

ModuleMap::~ModuleMap() {
  delete current_.load(std::memory_order_acquire);
  for (const Snapshot* s : retired_) delete s;
}

ModuleId ModuleMap::find(const Snapshot& s, uintptr_t address) {
  auto it = std::upper_bound(s.ranges.begin(), s.ranges.end(), address,
                             [](uintptr_t a, const Range& r) { return a < r.begin; });
  if (it == s.ranges.begin()) return kUnknownModule;
  --it;
  return address < it->end ? it->id : kUnknownModule;
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
  struct Ctx {
    ModuleMap* self;
    const Snapshot* old;
    Snapshot* fresh;
    bool unchanged;
  } ctx{this, old, nullptr, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) -> int {
        auto* c = static_cast<Ctx*>(data);
        if (c->fresh == nullptr) {
          // First object: the counters tell whether anything changed since the last snapshot.
          const bool has_counters = size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs);
          if (c->old && has_counters && info->dlpi_adds == c->old->adds && info->dlpi_subs == c->old->subs) {
            c->unchanged = true;
            return 1;
          }
          c->fresh = new Snapshot;
          if (has_counters) c->fresh->adds = info->dlpi_adds, c->fresh->subs = info->dlpi_subs;
        }
        uintptr_t begin = UINTPTR_MAX, end = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          begin = std::min<uintptr_t>(begin, info->dlpi_addr + ph.p_vaddr);
          end = std::max<uintptr_t>(end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        if (begin >= end) return 0;
        const bool is_exe = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
        std::string path = is_exe ? c->self->exe_ : std::string(info->dlpi_name);
        if (path.empty()) return 0;  // e.g. the vDSO under some loaders
        const uintptr_t self = reinterpret_cast<uintptr_t>(&own_anchor);
        const ModuleId id = c->self->intern(path, is_plumbing_path(path, self >= begin && self < end));
        if (id != kUnknownModule) c->fresh->ranges.push_back({begin, end, id, info->dlpi_addr});
        return 0;
      },
      &ctx);
  if (ctx.unchanged || ctx.fresh == nullptr) return;
  std::sort(ctx.fresh->ranges.begin(), ctx.fresh->ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  current_.store(ctx.fresh, std::memory_order_release);
  if (old != nullptr) retired_.push_back(old);  // stays readable by anyone still on it
}

bool ModuleMap::describe(uintptr_t address, std::string* path, uintptr_t* base) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto search = [&](const Snapshot* s) {
    if (s == nullptr) return false;
    for (const Range& r : s->ranges) {
      if (address < r.begin || address >= r.end) continue;
      *path = r.id < names_.size() ? names_[r.id] : std::string();
      *base = r.base;
      return !path->empty();
    }
    return false;
  };
  if (search(current_.load(std::memory_order_acquire))) return true;
  for (auto it = retired_.rbegin(); it != retired_.rend(); ++it)  // newest first: addresses get reused
    if (search(*it)) return true;
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
