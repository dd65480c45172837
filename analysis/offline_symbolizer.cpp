#include "offline_symbolizer.h"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>

#include <cstdlib>
#include <cstring>

namespace gpushim::analysis {
namespace {

std::string demangle(const char* name) {
  if (name == nullptr) return {};
  std::string plain(name);
  if (const size_t at = plain.find('@'); at != std::string::npos && at > 0) plain.resize(at);
  int status = 0;
  char* d = abi::__cxa_demangle(plain.c_str(), nullptr, nullptr, &status);
  if (status == 0 && d != nullptr) plain = d;
  std::free(d);
  return plain;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += kHex[c >> 4];
    s += kHex[c & 0xF];
  }
  return s;
}

// Separate debug files only from the local build-id tree and debuglink: an offline tool must not
// start downloading through debuginfod because a login shell set DEBUGINFOD_URLS.
int local_find_debuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base,
                         const char* file_name, const char* debuglink_file, GElf_Word debuglink_crc,
                         char** debuginfo_file_name) {
  const char* urls = getenv("DEBUGINFOD_URLS");
  if (urls != nullptr && urls[0] != '\0')
    return dwfl_build_id_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file, debuglink_crc,
                                        debuginfo_file_name);
  return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file, debuglink_crc,
                                      debuginfo_file_name);
}

char* g_debuginfo_path = nullptr;
const Dwfl_Callbacks kCallbacks = {dwfl_build_id_find_elf, local_find_debuginfo, nullptr, &g_debuginfo_path};

}  // namespace

// One libdw session per module, reported at bias 0: a frame's offset is then its ELF address,
// whatever address the module had in the traced process.
struct OfflineSymbolizer::Module {
  Dwfl* dwfl = nullptr;
  Dwfl_Module* mod = nullptr;
  const trace::ModuleInfo* info = nullptr;
  bool usable = false;
  ~Module() {
    if (dwfl) dwfl_end(dwfl);
  }
};

OfflineSymbolizer::OfflineSymbolizer(const TraceData& trace) : trace_(trace) {}

OfflineSymbolizer::~OfflineSymbolizer() {
  for (auto& [id, m] : modules_) delete m;
}

OfflineSymbolizer::Module* OfflineSymbolizer::module(uint32_t id) {
  auto it = modules_.find(id);
  if (it != modules_.end()) return it->second;
  auto* m = new Module;
  modules_[id] = m;
  auto info = trace_.modules.find(id);
  if (info == trace_.modules.end()) return m;
  m->info = &info->second;
  const std::string& path = m->info->path;
  if (path.empty() || path[0] != '/') return m;  // the vdso and friends have no file
  m->dwfl = dwfl_begin(&kCallbacks);
  if (m->dwfl == nullptr) return m;
  dwfl_report_begin(m->dwfl);
  m->mod = dwfl_report_elf(m->dwfl, base_name(path).c_str(), path.c_str(), -1, 0, false);
  dwfl_report_end(m->dwfl, nullptr, nullptr);
  if (m->mod == nullptr) {
    notes_.push_back("cannot read " + path + ": frames in it stay as offsets");
    return m;
  }
  if (!m->info->build_id.empty()) {
    const unsigned char* bits = nullptr;
    GElf_Addr vaddr = 0;
    const int n = dwfl_module_build_id(m->mod, &bits, &vaddr);
    if (n > 0 && (static_cast<size_t>(n) != m->info->build_id.size() ||
                  std::memcmp(bits, m->info->build_id.data(), static_cast<size_t>(n)) != 0)) {
      notes_.push_back(path + " changed since the trace was recorded (build id " +
                       hex(std::string(reinterpret_cast<const char*>(bits), static_cast<size_t>(n))) + ", recorded " +
                       hex(m->info->build_id) + "): frames in it stay as offsets");
      return m;
    }
  }
  m->usable = true;
  return m;
}

FrameInfo OfflineSymbolizer::resolve(const trace::FrameCode& code) {
  FrameInfo fi;
  if (code.selector == trace::kFramePython) {
    fi.python = true;
    auto it = trace_.pyframes.find(static_cast<uint32_t>(code.value));
    if (it != trace_.pyframes.end()) {
      fi.function = it->second.function;
      fi.file = it->second.file;
      fi.line = it->second.line;
    } else {
      fi.function = "<python frame " + std::to_string(code.value) + ">";
    }
    return fi;
  }
  if (code.selector == trace::kFrameRaw) {
    fi.address = code.value;
    return fi;
  }
  const uint32_t id = static_cast<uint32_t>(code.selector - trace::kFrameModule0);
  Module* m = module(id);
  fi.module_offset = code.value;
  if (m->info) {
    fi.module = m->info->path;
    fi.address = m->info->bias + code.value;
  }
  if (!m->usable || code.value == 0) return fi;
  // A return address points after the call; look up the call itself.
  const Dwarf_Addr lookup = code.value - 1;
  if (const char* name = dwfl_module_addrname(m->mod, lookup)) fi.function = demangle(name);
  if (Dwfl_Line* line = dwfl_module_getsrc(m->mod, lookup)) {
    int lineno = 0;
    if (const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) {
      fi.file = file;
      fi.line = lineno;
    }
  }
  return fi;
}

const std::vector<FrameInfo>& OfflineSymbolizer::stack(uint32_t id) {
  auto cached = stacks_.find(id);
  if (cached != stacks_.end()) return cached->second;
  auto it = trace_.stacks.find(id);
  if (it == trace_.stacks.end()) return empty_;
  std::vector<FrameInfo> out;
  out.reserve(it->second.size());
  for (const trace::FrameCode& code : it->second) {
    auto key = std::make_pair(code.selector, code.value);
    auto f = frames_.find(key);
    if (f == frames_.end()) f = frames_.emplace(key, resolve(code)).first;
    out.push_back(f->second);
  }
  return stacks_.emplace(id, std::move(out)).first->second;
}

std::string describe_frame(const FrameInfo& f) {
  std::string s;
  if (!f.function.empty()) {
    s = f.function;
  } else if (!f.module.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "+0x%llx", static_cast<unsigned long long>(f.module_offset));
    s = base_name(f.module) + buf;
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(f.address));
    s = buf;
  }
  if (!f.file.empty()) {
    s += " " + base_name(f.file);
    if (f.line > 0) s += ":" + std::to_string(f.line);
  }
  if (!f.python && !f.module.empty() && !f.function.empty()) s += " (" + base_name(f.module) + ")";
  return s;
}

bool is_plumbing_frame(const FrameInfo& f) {
  if (f.python) return false;
  const std::string m = base_name(f.module);
  return m.rfind("libgpushim", 0) == 0 || m.rfind("libcudart", 0) == 0 || m.rfind("libcuda.so", 0) == 0;
}

}  // namespace gpushim::analysis
