#include "offline_symbolizer.h"

#include <cstdio>
#include <memory>

#include "stacks/frame_roles.h"
#include "stacks/libdw_session.h"
#include "util/text.h"

namespace gpushim::analysis {
namespace {

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

}  // namespace

// One libdw session per module file (the symbolizer core, stacks/libdw_session.h), reported at
// bias 0: a frame's offset is then its ELF address, whatever address the module had in the traced
// process.
struct OfflineSymbolizer::Module {
  std::unique_ptr<LibdwSession> session;
  const trace::ModuleInfo* info = nullptr;
  bool usable = false;
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
  bool readable = false;
  m->session = LibdwSession::for_file(path, &readable);
  if (m->session == nullptr) {
    if (!libdw_missing_noted_) notes_.push_back("libdw.so.1 (elfutils) cannot be loaded: frames stay as offsets");
    libdw_missing_noted_ = true;
    return m;
  }
  if (!readable) {
    notes_.push_back("cannot read " + path + ": frames in it stay as offsets");
    return m;
  }
  if (!m->info->build_id.empty()) {
    const std::string id = m->session->build_id();
    if (!id.empty() && id != m->info->build_id) {
      notes_.push_back(path + " changed since the trace was recorded (build id " + hex(id) + ", recorded " +
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
  m->session->describe(code.value - 1, &fi);
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
  return printable(s);
}

std::string describe_site(const std::vector<FrameInfo>& frames, const char* none) {
  const FrameInfo* f = user_frame(frames);
  return f ? describe_frame(*f) : none;
}

// The shim's own definition (stacks/frame_roles.h): a static runtime linked into the program is
// plumbing here too.
bool is_plumbing_frame(const FrameInfo& f) { return frame_role(f) == FrameRole::kPlumbing; }

}  // namespace gpushim::analysis
