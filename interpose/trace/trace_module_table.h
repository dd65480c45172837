// The modules a trace names: the loaded objects of this process, each with the id, path, load
// bias and build id the trace records, so that stack frames are written as (module, offset) and
// offline tools symbolize them from the module files long after the process is gone. (The hot
// path's module lookup is stacks/module_map.h; both walk util/loaded_modules.h.) Used by the trace
// writer thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "trace/trace_encoder.h"

namespace gpushim::trace {

class TraceModuleTable {
 public:
  // The module containing `addr`, or null. Re-reads the loaded objects (dlopen'ed since the last
  // read) at most once per `refresh_token`, so that a burst of unknown addresses costs one scan.
  const ModuleInfo* find(uint64_t addr, uint64_t refresh_token);
  // Modules found since the last call, to be written before the stacks that use them.
  std::vector<ModuleInfo> take_new();

 private:
  void refresh();
  const ModuleInfo* lookup(uint64_t addr) const;

  std::vector<ModuleInfo> modules_;  // sorted by begin
  std::vector<ModuleInfo> fresh_;
  uint64_t last_refresh_token_ = UINT64_MAX;
  uint32_t next_id_ = 0;
};

}  // namespace gpushim::trace
