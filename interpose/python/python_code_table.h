// Interned Python source locations: (code object, instruction offset) -> a 32-bit id that goes
// into stack words (make_python_frame). The hot path is one lock-free probe per frame; a code
// object seen for the first time has its file name, qualified name, first line and line table
// copied once (under a lock), so that lines are computed only when a report asks, and never
// depend on the interpreter still being alive then.
#pragma once

#include <atomic>
#include <cstring>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "python/python_runtime.h"

namespace gpushim {

// What a location id stands for. The stack code turns it into a frame of its own (python/ knows
// nothing of stacks/, which reads it).
struct PythonLocation {
  std::string function;  // qualified name on 3.11+
  std::string file;
  int line = 0;          // 0: no line for that instruction
};

// Whether a function's (qualified) name is named by GPUSHIM_ITERATION_SITE `wanted`: "step" names
// "step", "Trainer.step" and "main.<locals>.step".
bool python_names_function(const std::string& qualname, const std::string& wanted);

// What tells a code object from one that reused its address after it was freed: the objects it
// owns, its first line, and from 3.12 co_version. The pointers alone are not enough: code compiled
// in a loop (exec, IPython-style cells) frees its code object, file name and line table together,
// and the next snippet's often take the very same three addresses with other contents (seen on
// 3.11-3.13). 3.12+ number every code object they create from one counter (co_version), so a new
// one never matches an old one's record. Before 3.12 no field of a code object tells, short of
// comparing the names and the line table by content on every frame: the pointers are all there is
// (docs/python.md says so).
struct PythonCodeIdentity {
  uintptr_t filename_obj = 0, name_obj = 0, table_obj = 0;
  int first_line = 0;
  uint32_t version = 0;  // co_version (3.12+), 0 before
  bool operator==(const PythonCodeIdentity& o) const {
    return filename_obj == o.filename_obj && name_obj == o.name_obj && table_obj == o.table_obj &&
           first_line == o.first_line && version == o.version;
  }
};

// Reads the identity of a live code object (one of the calling thread's frames runs it).
inline PythonCodeIdentity python_code_identity(const PythonLayout& L, uintptr_t code) {
  PythonCodeIdentity id;
  std::memcpy(&id.filename_obj, reinterpret_cast<const void*>(code + L.code_filename), sizeof(uintptr_t));
  std::memcpy(&id.name_obj, reinterpret_cast<const void*>(code + L.code_name), sizeof(uintptr_t));
  std::memcpy(&id.table_obj, reinterpret_cast<const void*>(code + L.code_linetable), sizeof(uintptr_t));
  std::memcpy(&id.first_line, reinterpret_cast<const void*>(code + L.code_firstlineno), sizeof(int));
  if (L.code_version >= 0)
    std::memcpy(&id.version, reinterpret_cast<const void*>(code + L.code_version), sizeof(uint32_t));
  return id;
}

class PythonCodeTable {
 public:
  // Id handed out once the table holds kMaxLocations; resolves to a placeholder frame.
  static constexpr uint32_t kTableFullId = UINT32_MAX;
  static constexpr size_t kMaxLocations = 1u << 20;

  // `iteration_site`: a function name (see iteration_site.h); "" for none.
  PythonCodeTable(const PythonRuntime& rt, std::string iteration_site);
  PythonCodeTable(const PythonCodeTable&) = delete;
  PythonCodeTable& operator=(const PythonCodeTable&) = delete;

  // The id of `byte_offset` in `code` (a live code object of the calling thread's stack). Sets
  // *is_iteration_site when the code is that of the iteration-site function.
  uint32_t location(uintptr_t code, int32_t byte_offset, bool* is_iteration_site) {
    const Table* t = table_.load(std::memory_order_acquire);
    for (size_t i = hash(code, byte_offset) & t->mask, probes = 0; probes <= t->mask; i = (i + 1) & t->mask, ++probes) {
      const Location* loc = t->slots[i].load(std::memory_order_acquire);
      if (loc == nullptr) break;
      if (loc->code == code && loc->offset == byte_offset) {
        if (!still_same_code(*loc->info)) break;  // freed, and another code object took its address
        *is_iteration_site = loc->info->iteration_site;
        return loc->id;
      }
    }
    return slow_location(code, byte_offset, is_iteration_site);
  }

  // File, function (qualified name on 3.11+) and line of `id`. False for an unknown id.
  bool resolve(uint32_t id, PythonLocation* out) const;

  size_t locations() const;
  size_t memory_bytes() const;
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 private:
  struct CodeInfo {
    uintptr_t code;
    PythonCodeIdentity identity;  // of the code object at `code` when it was read
    bool iteration_site;
    std::string filename, name, table;
  };
  struct Location {
    uintptr_t code;
    int32_t offset;
    uint32_t id;
    const CodeInfo* info;
  };
  struct Table {
    explicit Table(size_t capacity) : mask(capacity - 1), slots(new std::atomic<const Location*>[capacity]) {
      for (size_t i = 0; i < capacity; ++i) slots[i].store(nullptr, std::memory_order_relaxed);
    }
    size_t mask;
    std::unique_ptr<std::atomic<const Location*>[]> slots;
  };

  static uint64_t hash(uintptr_t code, int32_t offset) {
    uint64_t h = (code >> 3) ^ (static_cast<uint64_t>(static_cast<uint32_t>(offset)) << 40);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
  }
  bool still_same_code(const CodeInfo& info) const;
  uint32_t slow_location(uintptr_t code, int32_t byte_offset, bool* is_iteration_site);
  const CodeInfo* code_info(uintptr_t code);  // under mu_
  bool insert(Table* t, const Location* loc);  // under mu_; true if it took an empty slot

  const PythonRuntime& rt_;
  const std::string iteration_site_;
  std::atomic<Table*> table_;
  mutable std::mutex mu_;
  // Every table ever published: readers may still hold a retired one, so none is freed.
  std::vector<std::unique_ptr<Table>> tables_;
  size_t used_ = 0;  // slots in use in the current table
  std::deque<Location> locations_;  // by id; addresses stable
  std::deque<CodeInfo> codes_;
  absl::flat_hash_map<uintptr_t, const CodeInfo*> code_by_address_;
};

}  // namespace gpushim
