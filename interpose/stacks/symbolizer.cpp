#include "stacks/symbolizer.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "stacks/stack_table.h"
#include "util/loaded_modules.h"

namespace gpushim {

// Test hook, deliberately not in the header: lets the unit tests exercise the dladdr-only path on
// a machine that has libdw. Declared again (extern) by the tests that use it.
std::atomic<bool> g_symbolizer_libdw_disabled_for_testing{false};

namespace {

// --- The slice of elfutils' libdwfl.h we use, declared here so that neither its headers nor the
// library are build dependencies. Layouts and signatures match libdwfl.h (stable ABI since 0.122);
// every function is reached through dlsym on a RTLD_LOCAL handle, so libdw and libelf never
// join the host process's global symbol scope.
struct DwflOpaque;
struct DwflModuleOpaque;
struct DwflLineOpaque;
struct ElfOpaque;
using DwarfAddr = uint64_t;  // Dwarf_Addr, GElf_Addr
using DwarfWord = uint64_t;  // Dwarf_Word
using GElfWord = uint32_t;   // GElf_Word

struct DwflCallbacks {  // Dwfl_Callbacks
  int (*find_elf)(DwflModuleOpaque* mod, void** userdata, const char* modname, DwarfAddr base,
                  char** file_name, ElfOpaque** elfp);
  int (*find_debuginfo)(DwflModuleOpaque* mod, void** userdata, const char* modname, DwarfAddr base,
                        const char* file_name, const char* debuglink_file, GElfWord debuglink_crc,
                        char** debuginfo_file_name);
  int (*section_address)(DwflModuleOpaque* mod, void** userdata, const char* modname, DwarfAddr base,
                         const char* secname, GElfWord shndx, const void* shdr, DwarfAddr* addr);
  char** debuginfo_path;
};

using FindDebuginfoFn = decltype(DwflCallbacks::find_debuginfo);
using DwflBeginFn = DwflOpaque* (*)(const DwflCallbacks*);
using DwflEndFn = void (*)(DwflOpaque*);
using DwflReportBeginFn = void (*)(DwflOpaque*);
using DwflLinuxProcReportFn = int (*)(DwflOpaque*, pid_t);
using DwflReportEndFn = int (*)(DwflOpaque*, int (*)(DwflModuleOpaque*, void*, const char*, DwarfAddr, void*),
                                void*);
using DwflAddrmoduleFn = DwflModuleOpaque* (*)(DwflOpaque*, DwarfAddr);
using DwflModuleAddrnameFn = const char* (*)(DwflModuleOpaque*, DwarfAddr);
using DwflModuleGetsrcFn = DwflLineOpaque* (*)(DwflModuleOpaque*, DwarfAddr);
using DwflLineinfoFn = const char* (*)(DwflLineOpaque*, DwarfAddr*, int*, int*, DwarfWord*, DwarfWord*);

// libdw's own lookups, for local_find_debuginfo (a plain callback: it has no context argument).
std::atomic<FindDebuginfoFn> g_standard_find_debuginfo{nullptr};
std::atomic<FindDebuginfoFn> g_build_id_find_debuginfo{nullptr};

// Separate debug files are looked up locally only. dwfl_standard_find_debuginfo falls through to
// debuginfod when DEBUGINFOD_URLS is set (some distributions set it for every login shell), which
// would make a traced program's exit wait on HTTP downloads. In that case we keep to the local
// build-id tree (/usr/lib/debug/.build-id, where Debian's -dbgsym packages install).
int local_find_debuginfo(DwflModuleOpaque* mod, void** userdata, const char* modname, DwarfAddr base,
                         const char* file_name, const char* debuglink_file, GElfWord debuglink_crc,
                         char** debuginfo_file_name) {
  const char* urls = getenv("DEBUGINFOD_URLS");
  FindDebuginfoFn fn = g_build_id_find_debuginfo.load();
  if (urls == nullptr || urls[0] == '\0') {
    if (FindDebuginfoFn standard = g_standard_find_debuginfo.load()) fn = standard;
  }
  if (fn == nullptr) return -1;
  return fn(mod, userdata, modname, base, file_name, debuglink_file, debuglink_crc, debuginfo_file_name);
}

std::string demangle(const char* name) {
  if (name == nullptr) return {};
  // libdw names dynamic symbols with their version ("__libc_start_main@@GLIBC_2.34"); dladdr
  // does not. Drop it so one function has one name whichever path resolved it.
  std::string plain(name);
  if (const size_t at = plain.find('@'); at != std::string::npos && at > 0) plain.resize(at);
  int status = 0;
  char* d = abi::__cxa_demangle(plain.c_str(), nullptr, nullptr, &status);
  if (status == 0 && d != nullptr) plain = d;
  free(d);
  return plain;
}

}  // namespace

// Per-symbolizer native state. Named for its main job, the libdw session, but created on the first
// native resolve even without libdw so that the remaining state lives outside the public header.
struct Symbolizer::Dwarf {
  bool tried_libdw = false;
  std::string exe_path;  // /proc/self/exe, read once

  DwflCallbacks callbacks{};
  DwflOpaque* dwfl = nullptr;  // null: no libdw (or it failed); dladdr-only results
  DwflEndFn end = nullptr;
  DwflReportBeginFn report_begin = nullptr;
  DwflLinuxProcReportFn proc_report = nullptr;
  DwflReportEndFn report_end = nullptr;
  DwflAddrmoduleFn addrmodule = nullptr;
  DwflModuleAddrnameFn addrname = nullptr;
  DwflModuleGetsrcFn getsrc = nullptr;
  DwflLineinfoFn lineinfo = nullptr;
  // Load bases (dladdr's dli_fbase) for which a module miss already triggered a re-read of
  // /proc/self/maps: libraries dlopen'ed after the first resolve are picked up, without re-reading
  // the maps for every address of a module libdw cannot handle.
  absl::flat_hash_set<uint64_t> refreshed_bases;

  Dwarf() = default;
  Dwarf(const Dwarf&) = delete;
  Dwarf& operator=(const Dwarf&) = delete;
  ~Dwarf() {
    if (dwfl != nullptr) end(dwfl);
  }

  // Reads /proc/self/maps into the session; false if libdw reports nothing usable.
  bool report_modules() {
    report_begin(dwfl);
    const int rc = proc_report(dwfl, getpid());
    return report_end(dwfl, nullptr, nullptr) == 0 && rc == 0;
  }

  DwflModuleOpaque* module_for(uint64_t addr, uint64_t base) {
    DwflModuleOpaque* m = addrmodule(dwfl, addr);
    if (m == nullptr && base != 0 && refreshed_bases.insert(base).second && report_modules())
      m = addrmodule(dwfl, addr);
    return m;
  }

  // Called at the first native resolve, never at load: libdw drags in libelf and compression
  // libraries that a traced process has no other reason to map.
  void open_libdw() {
    tried_libdw = true;
    void* h = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return;
    // The handle is never closed: libdw may keep caches tied to it, and unloading at report
    // time buys nothing.
    auto sym = [h](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
      return *fn != nullptr;
    };
    DwflBeginFn begin = nullptr;
    const bool ok = sym(&begin, "dwfl_begin") && sym(&end, "dwfl_end") &&
                    sym(&report_begin, "dwfl_report_begin") && sym(&proc_report, "dwfl_linux_proc_report") &&
                    sym(&report_end, "dwfl_report_end") && sym(&addrmodule, "dwfl_addrmodule") &&
                    sym(&addrname, "dwfl_module_addrname") && sym(&getsrc, "dwfl_module_getsrc") &&
                    sym(&lineinfo, "dwfl_lineinfo") && sym(&callbacks.find_elf, "dwfl_linux_proc_find_elf");
    if (!ok) return;
    FindDebuginfoFn fn = nullptr;
    if (sym(&fn, "dwfl_standard_find_debuginfo")) g_standard_find_debuginfo.store(fn);
    if (sym(&fn, "dwfl_build_id_find_debuginfo")) g_build_id_find_debuginfo.store(fn);
    callbacks.find_debuginfo = local_find_debuginfo;
    callbacks.section_address = nullptr;  // only needed for relocatable (ET_REL) modules
    callbacks.debuginfo_path = nullptr;   // libdw's default: ":.debug:/usr/lib/debug"
    dwfl = begin(&callbacks);
    if (dwfl != nullptr && !report_modules()) {
      end(dwfl);
      dwfl = nullptr;
    }
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
    if (info.dli_sname != nullptr && info.dli_saddr != nullptr) fi.function = demangle(info.dli_sname);
  } else if (lookup != 0 && module_resolver_ != nullptr) {
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

  const bool libdw_allowed = !g_symbolizer_libdw_disabled_for_testing.load(std::memory_order_relaxed);
  if (libdw_allowed && !st.tried_libdw) st.open_libdw();
  if (libdw_allowed && st.dwfl != nullptr && lookup != 0) {
    if (DwflModuleOpaque* m = st.module_for(lookup, base)) {
      // .symtab also names static functions, which the dynamic symbol table behind dladdr lacks.
      if (const char* name = st.addrname(m, lookup)) fi.function = demangle(name);
      if (DwflLineOpaque* line = st.getsrc(m, lookup)) {
        int lineno = 0;
        const char* file = st.lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
        if (file != nullptr) {
          fi.file = file;
          fi.line = lineno;
        }
      }
    }
  }
  return cache_.emplace(word, std::move(fi)).first->second;
}

}  // namespace gpushim
