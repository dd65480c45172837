#include "stacks/libdw_session.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "stacks/frame_roles.h"
#include "util/paths.h"
#include "util/dlopen_guard.h"

namespace gpushim {
namespace {

// --- The slice of elfutils' libdwfl.h we use, declared here so that neither its headers nor the
// library are build dependencies. Layouts and signatures match libdwfl.h (stable ABI since 0.122).
struct DwflOpaque;
struct DwflModuleOpaque;
struct DwflLineOpaque;
struct DwarfOpaque;      // Dwarf
struct DwarfLineOpaque;  // Dwarf_Line
struct ElfOpaque;
using DwarfAddr = uint64_t;  // Dwarf_Addr, GElf_Addr
using DwarfWord = uint64_t;  // Dwarf_Word
using DwarfOff = uint64_t;   // Dwarf_Off
using GElfWord = uint32_t;   // GElf_Word
struct DwarfDie {  // Dwarf_Die: filled by libdw, opaque to us
  void* addr;
  void* cu;
  void* abbrev;
  long padding;
};

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

using FindElfFn = decltype(DwflCallbacks::find_elf);
using FindDebuginfoFn = decltype(DwflCallbacks::find_debuginfo);

// Every function is looked up on a RTLD_LOCAL handle that is never closed: libdw may keep caches
// tied to it, and unloading buys nothing.
struct Libdw {
  DwflOpaque* (*begin)(const DwflCallbacks*) = nullptr;
  void (*end)(DwflOpaque*) = nullptr;
  void (*report_begin)(DwflOpaque*) = nullptr;
  int (*report_end)(DwflOpaque*, int (*)(DwflModuleOpaque*, void*, const char*, DwarfAddr, void*), void*) = nullptr;
  int (*linux_proc_report)(DwflOpaque*, pid_t) = nullptr;
  DwflModuleOpaque* (*report_elf)(DwflOpaque*, const char* name, const char* file_name, int fd, DwarfAddr base,
                                  bool add_p_vaddr) = nullptr;
  DwflModuleOpaque* (*addrmodule)(DwflOpaque*, DwarfAddr) = nullptr;
  const char* (*module_addrname)(DwflModuleOpaque*, DwarfAddr) = nullptr;
  DwflLineOpaque* (*module_getsrc)(DwflModuleOpaque*, DwarfAddr) = nullptr;
  const char* (*lineinfo)(DwflLineOpaque*, DwarfAddr*, int*, int*, DwarfWord*, DwarfWord*) = nullptr;
  int (*module_build_id)(DwflModuleOpaque*, const unsigned char** bits, DwarfAddr* vaddr) = nullptr;
  FindElfFn linux_proc_find_elf = nullptr;
  FindElfFn build_id_find_elf = nullptr;
  FindDebuginfoFn standard_find_debuginfo = nullptr;  // may be null: then build_id_find_debuginfo
  FindDebuginfoFn build_id_find_debuginfo = nullptr;
  // Lines where module_getsrc finds none (CuIndex below). Optional: null leaves such frames
  // without a line, as before.
  DwarfOpaque* (*module_getdwarf)(DwflModuleOpaque*, DwarfAddr* bias) = nullptr;
  int (*nextcu)(DwarfOpaque*, DwarfOff off, DwarfOff* next_off, size_t* header_size, DwarfOff* abbrev_offset,
                uint8_t* address_size, uint8_t* offset_size) = nullptr;
  DwarfDie* (*offdie)(DwarfOpaque*, DwarfOff offset, DwarfDie* result) = nullptr;
  ptrdiff_t (*ranges)(DwarfDie*, ptrdiff_t offset, DwarfAddr* base, DwarfAddr* start, DwarfAddr* end) = nullptr;
  DwarfLineOpaque* (*getsrc_die)(DwarfDie* cudie, DwarfAddr addr) = nullptr;
  const char* (*linesrc)(DwarfLineOpaque*, DwarfWord* mtime, DwarfWord* length) = nullptr;
  int (*lineno)(DwarfLineOpaque*, int* line) = nullptr;
  bool scans_units() const {
    return module_getdwarf && nextcu && offdie && ranges && getsrc_die && linesrc && lineno;
  }
};

std::atomic<const Libdw*> g_libdw{nullptr};
std::atomic<bool> g_libdw_tried{false};

// Loaded at the first session, never at load time: libdw drags in libelf and compression
// libraries that a traced process has no other reason to map. Lock-free: racing first callers
// each load (dlopen counts references) and one table wins; no lock is ever held across fork.
const Libdw* libdw() {
  if (const Libdw* l = g_libdw.load(std::memory_order_acquire)) return l;
  if (g_libdw_tried.load(std::memory_order_acquire)) return nullptr;
  void* h = guarded_dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    g_libdw_tried.store(true, std::memory_order_release);
    return nullptr;
  }
  auto* l = new Libdw;
  auto sym = [h](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
    return *fn != nullptr;
  };
  const bool ok = sym(&l->begin, "dwfl_begin") && sym(&l->end, "dwfl_end") &&
                  sym(&l->report_begin, "dwfl_report_begin") && sym(&l->report_end, "dwfl_report_end") &&
                  sym(&l->linux_proc_report, "dwfl_linux_proc_report") && sym(&l->report_elf, "dwfl_report_elf") &&
                  sym(&l->addrmodule, "dwfl_addrmodule") && sym(&l->module_addrname, "dwfl_module_addrname") &&
                  sym(&l->module_getsrc, "dwfl_module_getsrc") && sym(&l->lineinfo, "dwfl_lineinfo") &&
                  sym(&l->module_build_id, "dwfl_module_build_id") &&
                  sym(&l->linux_proc_find_elf, "dwfl_linux_proc_find_elf") &&
                  sym(&l->build_id_find_elf, "dwfl_build_id_find_elf") &&
                  sym(&l->build_id_find_debuginfo, "dwfl_build_id_find_debuginfo");
  sym(&l->standard_find_debuginfo, "dwfl_standard_find_debuginfo");
  (void)(sym(&l->module_getdwarf, "dwfl_module_getdwarf") && sym(&l->nextcu, "dwarf_nextcu") &&
         sym(&l->offdie, "dwarf_offdie") && sym(&l->ranges, "dwarf_ranges") &&
         sym(&l->getsrc_die, "dwarf_getsrc_die") && sym(&l->linesrc, "dwarf_linesrc") &&
         sym(&l->lineno, "dwarf_lineno"));
  if (!ok) {
    delete l;
    g_libdw_tried.store(true, std::memory_order_release);
    return nullptr;
  }
  const Libdw* expected = nullptr;
  if (!g_libdw.compare_exchange_strong(expected, l, std::memory_order_acq_rel)) {
    delete l;
    return expected;
  }
  return l;
}

// Separate debug files are looked up locally only (a plain callback: it has no context argument,
// so it reads the table). dwfl_standard_find_debuginfo falls through to debuginfod when
// DEBUGINFOD_URLS is set (some distributions set it for every login shell), which would make a
// traced program's exit, or an offline tool, wait on HTTP downloads. In that case we keep to the
// local build-id tree (/usr/lib/debug/.build-id, where Debian's -dbgsym packages install).
int local_find_debuginfo(DwflModuleOpaque* mod, void** userdata, const char* modname, DwarfAddr base,
                         const char* file_name, const char* debuglink_file, GElfWord debuglink_crc,
                         char** debuginfo_file_name) {
  const Libdw* l = g_libdw.load(std::memory_order_acquire);
  if (l == nullptr) return -1;
  const char* urls = getenv("DEBUGINFOD_URLS");
  FindDebuginfoFn fn = l->build_id_find_debuginfo;
  if ((urls == nullptr || urls[0] == '\0') && l->standard_find_debuginfo != nullptr) fn = l->standard_find_debuginfo;
  return fn(mod, userdata, modname, base, file_name, debuglink_file, debuglink_crc, debuginfo_file_name);
}

// Which compile unit holds an address, from the units' own address ranges. libdwfl finds a unit
// through .debug_aranges alone before elfutils 0.191, and clang emits that section only with
// -gdwarf-aranges (GCC always does): every frame of a clang-built program got no line (Debian 12
// ships 0.188). Built once per module, at its first frame libdwfl has no line for; a module
// without DWARF gets an empty index.
class CuIndex {
 public:
  CuIndex(const Libdw& l, DwarfOpaque* dw, DwarfAddr bias) : dw_(dw), bias_(bias) {
    DwarfOff off = 0, next = 0;
    size_t header = 0;
    for (; dw != nullptr && l.nextcu(dw, off, &next, &header, nullptr, nullptr, nullptr) == 0; off = next) {
      DwarfDie die;
      if (l.offdie(dw, off + header, &die) == nullptr) continue;
      DwarfAddr base = 0, lo = 0, hi = 0;
      // A range at 0 is a function the linker dropped (a duplicate inline copy, --gc-sections):
      // its length stays, so it would cover _start and other code low in the file (a review
      // helper's reproducer: "at _start big.h:7"; e2e_dropped_copy).
      for (ptrdiff_t at = 0; (at = l.ranges(&die, at, &base, &lo, &hi)) > 0;)
        if (hi > lo && lo != 0) units_.push_back(Unit{lo, hi, off + header});
    }
    std::sort(units_.begin(), units_.end(), [](const Unit& a, const Unit& b) { return a.lo < b.lo; });
  }

  // Fills file and line for `address` (the session's, bias included) when a unit covers it.
  void describe(const Libdw& l, DwarfAddr address, FrameInfo* out) const {
    const DwarfAddr a = address - bias_;
    auto it = std::upper_bound(units_.begin(), units_.end(), a, [](DwarfAddr v, const Unit& u) { return v < u.lo; });
    // Ranges rarely overlap; a few steps back finds the unit whose range holds `a`.
    for (int steps = 0; it != units_.begin() && steps < 8; ++steps) {
      --it;
      if (a >= it->hi) continue;
      DwarfDie die;
      if (l.offdie(dw_, it->die, &die) == nullptr) return;
      DwarfLineOpaque* line = l.getsrc_die(&die, a);
      int lineno = 0;
      const char* file = line != nullptr ? l.linesrc(line, nullptr, nullptr) : nullptr;
      if (file != nullptr && l.lineno(line, &lineno) == 0) {
        out->file = file;
        out->line = lineno;
      }
      return;
    }
  }

 private:
  struct Unit {
    DwarfAddr lo, hi;
    DwarfOff die;
  };
  DwarfOpaque* dw_;
  DwarfAddr bias_;
  std::vector<Unit> units_;
};

}  // namespace

std::string demangle_symbol(const char* name) {
  if (name == nullptr) return {};
  std::string plain(name);
  if (const size_t at = plain.find('@'); at != std::string::npos && at > 0) plain.resize(at);
  int status = 0;
  char* d = abi::__cxa_demangle(plain.c_str(), nullptr, nullptr, &status);
  if (status == 0 && d != nullptr) plain = d;
  free(d);
  return plain;
}

struct LibdwSession::State {
  const Libdw* l = nullptr;
  DwflCallbacks callbacks{};  // libdw keeps a pointer to it: lives as long as the session
  DwflOpaque* dwfl = nullptr;
  DwflModuleOpaque* file_module = nullptr;  // for_file: the one module
  // Per module, once libdwfl had no line for one of its addresses. Modules are libdwfl's, valid
  // until the next report: refresh() drops the indexes.
  std::unordered_map<DwflModuleOpaque*, std::unique_ptr<CuIndex>> cu_indexes;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (dwfl != nullptr) l->end(dwfl);
  }

  bool open(FindElfFn find_elf) {
    callbacks.find_elf = find_elf;
    callbacks.find_debuginfo = local_find_debuginfo;
    callbacks.section_address = nullptr;  // only needed for relocatable (ET_REL) modules
    callbacks.debuginfo_path = nullptr;   // libdw's default: ":.debug:/usr/lib/debug"
    dwfl = l->begin(&callbacks);
    return dwfl != nullptr;
  }
};

LibdwSession::LibdwSession(std::unique_ptr<State> s) : s_(std::move(s)) {}
LibdwSession::~LibdwSession() = default;

std::unique_ptr<LibdwSession> LibdwSession::for_this_process() {
  auto s = std::make_unique<State>();
  s->l = libdw();
  if (s->l == nullptr || !s->open(s->l->linux_proc_find_elf)) return nullptr;
  std::unique_ptr<LibdwSession> session(new LibdwSession(std::move(s)));
  if (!session->refresh()) return nullptr;
  return session;
}

std::unique_ptr<LibdwSession> LibdwSession::for_file(const std::string& path, bool* readable) {
  *readable = false;
  auto s = std::make_unique<State>();
  s->l = libdw();
  if (s->l == nullptr || !s->open(s->l->build_id_find_elf)) return nullptr;
  const std::string name(base_name(path));
  s->l->report_begin(s->dwfl);
  s->file_module = s->l->report_elf(s->dwfl, name.c_str(), path.c_str(), -1, 0, false);
  s->l->report_end(s->dwfl, nullptr, nullptr);
  *readable = s->file_module != nullptr;
  return std::unique_ptr<LibdwSession>(new LibdwSession(std::move(s)));
}

bool LibdwSession::refresh() {
  s_->cu_indexes.clear();
  s_->l->report_begin(s_->dwfl);
  const int rc = s_->l->linux_proc_report(s_->dwfl, getpid());
  return s_->l->report_end(s_->dwfl, nullptr, nullptr) == 0 && rc == 0;
}

bool LibdwSession::describe(uint64_t address, FrameInfo* out) {
  DwflModuleOpaque* m = s_->l->addrmodule(s_->dwfl, address);
  if (m == nullptr) return false;
  // The symbol table also names static functions, which the dynamic one behind dladdr lacks.
  if (const char* name = s_->l->module_addrname(m, address)) out->function = demangle_symbol(name);
  if (c_runtime_module(out->module)) return true;
  if (DwflLineOpaque* line = s_->l->module_getsrc(m, address)) {
    int lineno = 0;
    if (const char* file = s_->l->lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) {
      out->file = file;
      out->line = lineno;
      return true;
    }
  }
  if (!s_->l->scans_units()) return true;
  std::unique_ptr<CuIndex>& index = s_->cu_indexes[m];
  if (index == nullptr) {
    DwarfAddr bias = 0;
    DwarfOpaque* dw = s_->l->module_getdwarf(m, &bias);
    index = std::make_unique<CuIndex>(*s_->l, dw, bias);
  }
  index->describe(*s_->l, address, out);
  return true;
}

std::string LibdwSession::build_id() {
  if (s_->file_module == nullptr) return {};
  const unsigned char* bits = nullptr;
  DwarfAddr vaddr = 0;
  const int n = s_->l->module_build_id(s_->file_module, &bits, &vaddr);
  return n > 0 ? std::string(reinterpret_cast<const char*>(bits), static_cast<size_t>(n)) : std::string();
}

}  // namespace gpushim
