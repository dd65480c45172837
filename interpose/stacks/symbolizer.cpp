#include "stacks/symbolizer.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "stacks/libdw_session.h"
#include "stacks/stack_table.h"
#include "util/loaded_modules.h"

namespace gpushim {

// Test hook, deliberately not in the header: lets the unit tests exercise the dladdr-only path on
// a machine that has libdw. Declared again (extern) by the tests that use it.
std::atomic<bool> g_symbolizer_libdw_disabled_for_testing{false};

// Per-symbolizer native state. Created at the first native resolve, so that it lives outside the
// public header.
struct Symbolizer::Dwarf {
  bool tried_libdw = false;
  std::string exe_path;  // /proc/self/exe, read once
  std::unique_ptr<LibdwSession> session;  // null: no libdw (or it failed); dladdr-only results
  // Load bases (dladdr's dli_fbase) for which a module miss already triggered a re-read of
  // /proc/self/maps: libraries dlopen'ed after the first resolve are picked up, without re-reading
  // the maps for every address of a module libdw cannot handle.
  absl::flat_hash_set<uint64_t> refreshed_bases;

  bool describe(uint64_t addr, uint64_t base, FrameInfo* fi) {
    if (session->describe(addr, fi)) return true;
    return base != 0 && refreshed_bases.insert(base).second && session->refresh() && session->describe(addr, fi);
  }
};

Symbolizer::Symbolizer() = default;

Symbolizer::~Symbolizer() { delete dwarf_; }

const std::string& Symbolizer::module_of(uint64_t address) {
  auto it = module_cache_.find(address);
  if (it != module_cache_.end()) return it->second;
  Dl_info info{};
  std::string name;
  if (address != 0 && dladdr(reinterpret_cast<void*>(address), &info) != 0 && info.dli_fname != nullptr)
    name = info.dli_fname;
  return module_cache_.emplace(address, std::move(name)).first->second;
}

const FrameInfo& Symbolizer::resolve(uint64_t word) {
  auto it = cache_.find(word);
  if (it != cache_.end()) return it->second;

  FrameInfo fi;
  if (is_python_frame(word)) {
    const uint32_t id = python_frame_id(word);
    if (python_resolver_ == nullptr || !python_resolver_(id, &fi)) {
      fi = FrameInfo{};
      fi.function = "<python frame " + std::to_string(id) + ">";
    }
    fi.python = true;
    fi.address = 0;
    fi.module_offset = 0;
    return cache_.emplace(word, std::move(fi)).first->second;
  }

  fi.address = word;
  // Return addresses point at the instruction after the call, which may already belong to the
  // next function or line (a noreturn call ends its function); look up the call itself.
  const uint64_t lookup = word > 0 ? word - 1 : 0;

  if (dwarf_ == nullptr) dwarf_ = new Dwarf();
  Dwarf& st = *dwarf_;

  if (lookup != 0 && module_resolver_ != nullptr) {
    // Unloaded since: module and offset from the module table, enough for offline symbolization
    // (gpushim-analyze) and for the reader to know whose frame it is. libdw's session holds only
    // what is mapped now, so it is not asked.
    std::string path;
    uint64_t module_base = 0;
    if (module_resolver_(lookup, &path, &module_base)) {
      fi.module = path;
      fi.module_offset = word - module_base;
      return cache_.emplace(word, std::move(fi)).first->second;
    }
  }

  Dl_info info{};
  link_map* map = nullptr;
  uint64_t base = 0;
  if (lookup != 0 &&
      dladdr1(reinterpret_cast<void*>(lookup), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0) {
    base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    fi.module_offset = word - base;
    // glibc reports the main program by argv[0] (possibly relative, or a bare name found on
    // PATH); offline tools need the real file.
    if (map != nullptr && (map->l_name == nullptr || map->l_name[0] == '\0')) {
      if (st.exe_path.empty()) st.exe_path = self_exe_path();
      fi.module = !st.exe_path.empty() ? st.exe_path : (info.dli_fname ? info.dli_fname : "");
    } else if (info.dli_fname != nullptr) {
      fi.module = info.dli_fname;
    }
    if (info.dli_sname != nullptr && info.dli_saddr != nullptr) fi.function = demangle_symbol(info.dli_sname);
  }

  const bool libdw_allowed = !g_symbolizer_libdw_disabled_for_testing.load(std::memory_order_relaxed);
  if (libdw_allowed && !st.tried_libdw) {
    // At the first native resolve, never at load (see libdw_session.h).
    st.tried_libdw = true;
    st.session = LibdwSession::for_this_process();
  }
  if (libdw_allowed && st.session != nullptr && lookup != 0) st.describe(lookup, base, &fi);
  return cache_.emplace(word, std::move(fi)).first->second;
}

}  // namespace gpushim
