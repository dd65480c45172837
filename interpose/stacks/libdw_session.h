// The symbolizer core: function, source file and line of a code address, from elfutils' libdwfl.
// The shim's Symbolizer asks it about the live process (its mappings); gpushim-analyze's
// OfflineSymbolizer about the module files a trace names, long after the process is gone. Both
// get the same names (demangled, without symbol versions), the same lookup of the call instruction
// and the same rule for separate debug files: local only, never debuginfod.
//
// libdw is reached through dlopen (RTLD_LOCAL), never linked: neither its headers nor the library
// are build dependencies, a traced process maps it only when a report asks for lines, and libdw and
// libelf never join the host process's global symbol scope.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "stacks/symbolizer.h"

namespace gpushim {

// Demangles a C++ symbol ("_ZN3foo3barEv" -> "foo::bar()"), dropping a symbol version first
// ("__libc_start_main@@GLIBC_2.34": libdw names dynamic symbols so, dladdr does not) so that one
// function has one name whichever path resolved it. "" for null; other names unchanged.
std::string demangle_symbol(const char* name);

class LibdwSession {
 public:
  // Over this process's mappings (/proc/self/maps). Null when libdw cannot be loaded or reports
  // nothing usable.
  static std::unique_ptr<LibdwSession> for_this_process();
  // Over one ELF file, reported at bias 0: an address is then the file's own (ELF) address,
  // whatever address the module had in the process that ran it. Null when libdw cannot be loaded;
  // *readable false when the file cannot be read as ELF.
  static std::unique_ptr<LibdwSession> for_file(const std::string& path, bool* readable);

  ~LibdwSession();
  LibdwSession(const LibdwSession&) = delete;
  LibdwSession& operator=(const LibdwSession&) = delete;

  // Fills out->function (from the symbol table: static functions too), out->file and out->line
  // when known. `address` is the call instruction itself: a return address minus one, since the
  // return address may already belong to the next line or function. False when no module of
  // the session holds `address` (nothing is filled). The caller has set out->module: a module
  // of the C runtime gets its name only (c_runtime_module, frame_roles.h).
  bool describe(uint64_t address, FrameInfo* out);
  // Re-reads this process's mappings: modules dlopen'ed since are found. for_this_process only.
  bool refresh();
  // The GNU build id of a for_file session's module; "" when it has none.
  std::string build_id();

 private:
  struct State;
  explicit LibdwSession(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace gpushim
