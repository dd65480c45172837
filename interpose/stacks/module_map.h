// Which loaded module (executable or shared object) a code address belongs to, on the hot path.
//
// Every allocation records the module that called into CUDA. dladdr costs ~200 ns and takes the
// loader lock; this map answers from an immutable snapshot of the PT_LOAD ranges of every loaded
// object (util/loaded_modules.h) with one binary search and no lock. A miss rebuilds the snapshot only if
// objects were loaded or unloaded since it was taken. Old snapshots are kept (never freed), so a
// reader never races a rebuild; there is one per change of the loaded set, which stays small
// (the shim's map lives as long as the process; others free them all when destroyed).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace gpushim {

using ModuleId = uint16_t;
constexpr ModuleId kUnknownModule = 0;  // an address in no loaded module (JIT code, or none)

class ModuleMap {
 public:
  ModuleMap();
  ~ModuleMap();
  ModuleMap(const ModuleMap&) = delete;
  ModuleMap& operator=(const ModuleMap&) = delete;

  // Thread-safe, lock-free on a hit.
  ModuleId lookup(uintptr_t address);

  // Changes whenever lookup() answers from a different set of loaded objects (a rebuild after a
  // dlopen or dlclose), never back to an earlier value: lets a caller cache lookup's answers.
  uintptr_t generation() const { return reinterpret_cast<uintptr_t>(current_.load(std::memory_order_acquire)); }

  // The module's path ("" for kUnknownModule); the main program by its real path.
  std::string name(ModuleId id) const;
  // libcudart, libcuda and the shim itself: frames there do not say who allocated.
  bool is_cuda_plumbing(ModuleId id) const;
  // A moment of the loaded set, taken by view(): the snapshot current then, and how many older
  // ones there were.
  struct View {
    const void* snapshot = nullptr;
    size_t retired = 0;
  };
  // Brings the map up to date with the loader and pins that moment. Taken before a report is
  // symbolized: libraries loaded after it (libdw and its dependencies, loaded to write the report)
  // cannot own a frame captured before.
  View view();
  // True if, at `v`, `address` lay in no loaded module but in one the map had seen loaded before:
  // its path and load base (the newest such), which dladdr no longer knows. Lets the report name
  // the module and the offset of frames in dlclose'd libraries. One caveat: a stack captured before
  // a dlclose whose address range a library loaded before `v` reuses is named after that library.
  bool describe_unloaded(const View& v, uintptr_t address, std::string* path, uintptr_t* base) const;

  // fork(): the rebuild lock is held across fork so the child never inherits it taken.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 private:
  struct Range {
    uintptr_t begin, end;
    ModuleId id;
    uintptr_t base = 0;  // the object's load bias (dlpi_addr): module offsets are from it
  };
  struct Snapshot {
    unsigned long long adds = 0, subs = 0;  // the loader's load/unload counters when taken
    std::vector<Range> ranges;              // sorted by begin
  };
  static constexpr size_t kMaxModules = 4096;

  static const Range* find_range(const Snapshot& s, uintptr_t address);  // null: in no module
  static ModuleId find(const Snapshot& s, uintptr_t address);
  // Requires mu_. Interns `path` and returns its id (kUnknownModule when the table is full).
  ModuleId intern(const std::string& path, bool plumbing);
  void rebuild();  // requires mu_

  std::atomic<const Snapshot*> current_{nullptr};
  mutable std::mutex mu_;
  std::vector<const Snapshot*> retired_;       // replaced snapshots: readers may still be on them
  std::vector<std::string> names_;             // by id; index 0 is the unknown module
  absl::flat_hash_map<std::string, ModuleId> ids_;
  std::atomic<uint8_t> plumbing_[kMaxModules] = {};
  std::atomic<size_t> count_{1};
  std::string exe_;
};

}  // namespace gpushim
