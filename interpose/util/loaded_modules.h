// The one walk over the loaded objects of this process (dl_iterate_phdr): the module map of the
// hot path, the trace's module records, the interpreter's and the shim's own address ranges all
// read it from here, so "a module" means the same span everywhere: the hull of its PT_LOAD
// segments, with the main program under its real path.
#pragma once

#include <link.h>

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"

namespace gpushim {

struct LoadedModule {
  const char* name = "";       // dlpi_name: "" (or argv[0], by loader) for the main program
  bool is_main = false;        // name is empty: the main program, whose file is self_exe_path()
  uintptr_t bias = 0;          // load bias (dlpi_addr): module offsets are from it
  uintptr_t begin = 0, end = 0;  // [begin, end): the hull of its PT_LOAD segments, never empty
  // The loader's load and unload counters at the time of the walk; has_counters false on loaders
  // that lack them.
  bool has_counters = false;
  unsigned long long adds = 0, subs = 0;
  const dl_phdr_info* info = nullptr;  // the loader's entry, valid during the callback only
};

// Calls `fn` for each loaded object that maps something (objects without PT_LOAD segments are
// skipped), in the loader's order; `fn` returns false to stop the walk. Takes the loader's lock:
// never from a signal handler, and `fn` must not dlopen or dlclose.
void for_each_loaded_module(absl::FunctionRef<bool(const LoadedModule&)> fn);

// The span of the loaded object that contains `address`; false if none does.
bool loaded_module_range(uintptr_t address, uintptr_t* begin, uintptr_t* end);

// NT_GNU_BUILD_ID of a module, read from its PT_NOTE segments in memory ("" when it has none):
// identifies the exact file, so offline symbolization can tell a rebuilt binary from the one that ran.
std::string loaded_module_build_id(const LoadedModule& m);

// The main program's real path (/proc/self/exe), "" if unreadable. glibc names the main program ""
// or by argv[0] (possibly relative, or a bare name found on PATH); tools reading a path later need
// the real file.
std::string self_exe_path();

}  // namespace gpushim
