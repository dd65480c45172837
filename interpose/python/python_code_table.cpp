#include "python/python_code_table.h"

#include "python/line_table.h"
#include "python/python_memory.h"
#include "python/python_objects.h"

namespace gpushim {
namespace {

constexpr size_t kInitialSlots = 1024;
constexpr size_t kMaxNameChars = 1024;
constexpr size_t kMaxFileChars = 4096;
constexpr size_t kMaxLineTableBytes = 1u << 20;

}  // namespace

bool python_names_function(const std::string& qualname, const std::string& wanted) {
  if (wanted.empty()) return false;
  if (qualname == wanted) return true;
  return qualname.size() > wanted.size() && qualname.compare(qualname.size() - wanted.size(), wanted.size(), wanted) == 0 &&
         qualname[qualname.size() - wanted.size() - 1] == '.';
}

PythonCodeTable::PythonCodeTable(const PythonRuntime& rt, std::string iteration_site)
    : rt_(rt), iteration_site_(std::move(iteration_site)) {
  tables_.push_back(std::make_unique<Table>(kInitialSlots));
  table_.store(tables_.back().get(), std::memory_order_release);
}

bool PythonCodeTable::still_same_code(const CodeInfo& info) const {
  return python_code_identity(*rt_.layout, info.code) == info.identity;
}

const PythonCodeTable::CodeInfo* PythonCodeTable::code_info(uintptr_t code) {
  auto it = code_by_address_.find(code);
  if (it != code_by_address_.end() && still_same_code(*it->second)) return it->second;
  const PythonLayout& L = *rt_.layout;
  CodeInfo& info = codes_.emplace_back();
  info.code = code;
  info.identity = python_code_identity(L, code);
  copy_python_str(rt_, info.identity.filename_obj, kMaxFileChars, &info.filename);
  copy_python_str(rt_, info.identity.name_obj, kMaxNameChars, &info.name);
  copy_python_bytes(rt_, info.identity.table_obj, kMaxLineTableBytes, &info.table);
  info.iteration_site = python_names_function(info.name, iteration_site_);
  code_by_address_[code] = &info;
  return &info;
}

bool PythonCodeTable::insert(Table* t, const Location* loc) {
  for (size_t i = hash(loc->code, loc->offset) & t->mask;; i = (i + 1) & t->mask) {
    const Location* cur = t->slots[i].load(std::memory_order_relaxed);
    // The same (code, offset) with a stale code object is replaced in place.
    if (cur == nullptr || (cur->code == loc->code && cur->offset == loc->offset)) {
      t->slots[i].store(loc, std::memory_order_release);
      return cur == nullptr;
    }
  }
}

uint32_t PythonCodeTable::slow_location(uintptr_t code, int32_t byte_offset, bool* is_iteration_site) {
  std::lock_guard<std::mutex> lock(mu_);
  const CodeInfo* info = code_info(code);
  *is_iteration_site = info->iteration_site;
  // Another thread may have added it since our probe.
  Table* t = table_.load(std::memory_order_relaxed);
  for (size_t i = hash(code, byte_offset) & t->mask;; i = (i + 1) & t->mask) {
    const Location* loc = t->slots[i].load(std::memory_order_relaxed);
    if (loc == nullptr) break;
    if (loc->code == code && loc->offset == byte_offset && loc->info == info) return loc->id;
  }
  if (locations_.size() >= kMaxLocations) return kTableFullId;
  if ((used_ + 1) * 2 > t->mask + 1) {
    // Grow: readers keep probing the old table (never freed) until they load the new one.
    auto bigger = std::make_unique<Table>((t->mask + 1) * 2);
    used_ = 0;
    for (size_t i = 0; i <= t->mask; ++i)
      if (const Location* loc = t->slots[i].load(std::memory_order_relaxed)) used_ += insert(bigger.get(), loc);
    t = bigger.get();
    tables_.push_back(std::move(bigger));
    table_.store(t, std::memory_order_release);
  }
  const uint32_t id = static_cast<uint32_t>(locations_.size());
  const Location& loc = locations_.emplace_back(Location{code, byte_offset, id, info});
  used_ += insert(t, &loc);
  return id;
}

bool PythonCodeTable::resolve(uint32_t id, PythonLocation* out) const {
  if (id == kTableFullId) {
    out->function = "<python frame not recorded: location table full>";
    return true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= locations_.size()) return false;
  const Location& loc = locations_[id];
  out->function = loc.info->name;
  out->file = loc.info->filename;
  out->line = python_line_for_offset(rt_.layout->lines, loc.info->table, loc.info->identity.first_line, loc.offset);
  return true;
}

size_t PythonCodeTable::locations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return locations_.size();
}

size_t PythonCodeTable::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = locations_.size() * sizeof(Location) + code_by_address_.capacity() * (2 * sizeof(uintptr_t) + 1);
  for (const auto& t : tables_) n += (t->mask + 1) * sizeof(void*);
  for (const CodeInfo& c : codes_) n += sizeof(CodeInfo) + c.filename.capacity() + c.name.capacity() + c.table.capacity();
  return n;
}

}  // namespace gpushim
