// Turns frame words into function/file/line/module, only when a report is written.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"

namespace gpushim {

struct FrameInfo {
  std::string function;  // demangled; "" if unknown
  std::string file;      // source file; "" if no debug info
  int line = 0;          // 0 if unknown
  std::string module;    // shared object or executable path; "" if unknown
  uint64_t address = 0;  // the raw return address (0 for Python frames)
  uint64_t module_offset = 0;  // address - module load base, for offline symbolization
  bool python = false;   // a Python source frame rather than a native one
};

// Resolves native return addresses with dladdr, plus DWARF line info and non-exported symbols
// through elfutils' libdw when it can be dlopen'ed. Python frame words are resolved through the
// Python frame table (set_python_resolver). Caches per address. Not thread-safe: one report at a time.
class Symbolizer {
 public:
  // A std::function so that the resolver can be bound to the table that owns the ids.
  using PythonResolver = std::function<bool(uint32_t id, FrameInfo* out)>;

  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  void set_python_resolver(PythonResolver r) { python_resolver_ = std::move(r); }
  // For native frames of a library unloaded since they were captured (a dlclose'd plugin): true
  // with the module's path and load base as the process's module table recorded them. Asked before
  // dladdr, which knows nothing there or, worse, names a library loaded later at the same address.
  using ModuleResolver = std::function<bool(uint64_t address, std::string* path, uint64_t* base)>;
  void set_module_resolver(ModuleResolver r) { module_resolver_ = std::move(r); }

  // `word` is a frame word from the StackTable (see stack_table.h). The reference stays valid
  // until the Symbolizer is destroyed.
  const FrameInfo& resolve(uint64_t word);

  // The module (dladdr's dli_fname) containing a code address; "" if none. Cached; the reference
  // stays valid until the Symbolizer is destroyed.
  const std::string& module_of(uint64_t address);

 private:
  struct Dwarf;  // libdw state, when available
  Dwarf* dwarf_ = nullptr;
  PythonResolver python_resolver_;
  ModuleResolver module_resolver_;
  // Node maps: callers hold the returned references across further lookups.
  absl::node_hash_map<uint64_t, FrameInfo> cache_;
  absl::node_hash_map<uint64_t, std::string> module_cache_;
};

}  // namespace gpushim
