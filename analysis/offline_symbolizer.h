// Symbolizes the stacks of a trace after the fact, from the module files the trace names, through
// the shim's own symbolizer core (stacks/libdw_session.h: elfutils' libdw, symbol tables and DWARF
// line info), so a frame gets the same name offline as in the exit report. A module whose file is gone, or whose build id no
// longer matches the one recorded, keeps its frames as module+offset.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "stacks/symbolizer.h"
#include "trace_reader.h"

namespace gpushim::analysis {

class OfflineSymbolizer {
 public:
  explicit OfflineSymbolizer(const TraceData& trace);
  ~OfflineSymbolizer();
  OfflineSymbolizer(const OfflineSymbolizer&) = delete;
  OfflineSymbolizer& operator=(const OfflineSymbolizer&) = delete;

  // The frames of a stack id, innermost first (empty for the empty stack or an unknown id).
  // The reference stays valid until the symbolizer is destroyed.
  const std::vector<FrameInfo>& stack(uint32_t id);
  // Problems met, one line each (missing files, build id mismatches), for the user.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  struct Module;
  FrameInfo resolve(const trace::FrameCode& code);
  Module* module(uint32_t id);

  const TraceData& trace_;
  std::map<uint32_t, Module*> modules_;
  absl::flat_hash_map<uint32_t, std::vector<FrameInfo>> stacks_;
  std::map<std::pair<uint64_t, uint64_t>, FrameInfo> frames_;  // (selector, value) -> resolved
  std::vector<std::string> notes_;
  bool libdw_missing_noted_ = false;
  std::vector<FrameInfo> empty_;
};

// A frame as one short line: "function file:line (module)" with what is known, control bytes as
// '?' (util/text.h's printable(), which the rest of gpushim-analyze's lines use too).
std::string describe_frame(const FrameInfo& f);
// A stack's site in one line: its innermost frame of the user's own code (stacks/frame_roles.h),
// as summary, diff and merge lead with it; `none` when no frame is outside the shim and CUDA.
// The innermost frame outside the shim named libffi or libtorch for Python programs.
std::string describe_site(const std::vector<FrameInfo>& frames, const char* none);
// True for frames inside the shim, the CUDA runtime or the driver: they say nothing about who
// allocated, so summaries and flame graphs skip them.
bool is_plumbing_frame(const FrameInfo& f);

}  // namespace gpushim::analysis
