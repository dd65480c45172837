#include "config/config.h"

#include <cerrno>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <functional>

#include "config/torch_alloc.h"
#include "util/units.h"

namespace gpushim {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Plain non-negative decimal integer no larger than `max`; nothing else (no sign, no junk).
bool parse_uint(std::string_view s, uint64_t max, uint64_t* out) {
  s = trim(s);
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool parse_bool(std::string_view s, bool* out) {
  s = trim(s);
  if (s == "1" || iequals(s, "on") || iequals(s, "true") || iequals(s, "yes")) return *out = true, true;
  if (s == "0" || iequals(s, "off") || iequals(s, "false") || iequals(s, "no")) return *out = false, true;
  return false;
}

struct Variable {
  const char* name;
  const char* accepted;
  const char* default_value;
  const char* description;
  // Returns false if the value is not accepted; the table row's `accepted` is then the message.
  std::function<bool(std::string_view, Config*)> apply;
};

const std::vector<Variable>& variables() {
  static const std::vector<Variable>* table = new std::vector<Variable>{
      {"GPUSHIM_POLICY", "caching, vmm or passthrough", "caching",
       "How device allocations are served. caching: a best-fit pool over driver segments with safe reuse. "
       "vmm: the same reuse rules over physical memory the pool maps itself (cuMemCreate/cuMemMap), so "
       "free memory anywhere can be remapped into one range and the pool holds little more than is "
       "allocated; its memory cannot be shared with cudaIpcGetMemHandle. "
       "passthrough: every call goes to CUDA and is only accounted.",
       [](std::string_view v, Config* c) {
         v = trim(v);
         if (iequals(v, "passthrough")) return c->policy = PolicyKind::kPassthrough, true;
         if (iequals(v, "caching")) return c->policy = PolicyKind::kCaching, true;
         if (iequals(v, "vmm")) return c->policy = PolicyKind::kVmm, true;
         return false;
       }},
      {"GPUSHIM_LIMIT",
       "bytes with units (8GiB, 512MiB, 80GB), at least 1MiB, or a whole percentage of capacity from 1% to 100% "
       "(60%)",
       "none",
       "Per-device cap on the memory the process holds from the driver. Past it, allocations fail like a "
       "real OOM, and cudaMemGetInfo reports the capped total.",
       [](std::string_view v, Config* c) {
         std::string_view t = trim(v);
         if (!t.empty() && t.back() == '%') {
           t.remove_suffix(1);
           uint64_t whole = 0;
           if (!parse_uint(t, 100, &whole) || whole == 0) return false;
           c->limit = LimitSpec{0, static_cast<double>(whole)};
           return true;
         }
         uint64_t bytes = 0;
         // Below 1 MiB no allocation fits: GPUSHIM_LIMIT=8 (8 bytes) was meant as 8GiB, and
         // refusing it says so at once, where a cap that fails every allocation only looks like OOM.
         if (!parse_bytes(t, &bytes) || bytes < (1u << 20)) return false;
         c->limit = LimitSpec{bytes, 0};
         return true;
       }},
      {"GPUSHIM_ROUND", "a power of two from 256B to 2MiB", "512B",
       "Caching policy: every block is rounded up to a multiple of this.",
       [](std::string_view v, Config* c) {
         uint64_t b = 0;
         if (!parse_bytes(v, &b) || b < 256 || b > (2u << 20) || (b & (b - 1))) return false;
         c->round_bytes = b;
         return true;
       }},
      {"GPUSHIM_SMALL_SEGMENT", "bytes from 1MiB to 64MiB, a multiple of 2MiB or exactly 1MiB", "2MiB",
       "Caching policy: segment size for requests up to 1 MiB.",
       [](std::string_view v, Config* c) {
         uint64_t b = 0;
         if (!parse_bytes(v, &b) || b < (1u << 20) || b > (64u << 20) || (b != (1u << 20) && b % (2u << 20)))
           return false;
         c->small_segment = b;
         return true;
       }},
      {"GPUSHIM_LARGE_SEGMENT", "bytes from 10MiB to 1GiB, a multiple of 2MiB", "20MiB",
       "Caching policy: segment size for requests from 1 MiB to 10 MiB; larger requests get a segment of "
       "their own, rounded to 2 MiB.",
       [](std::string_view v, Config* c) {
         uint64_t b = 0;
         if (!parse_bytes(v, &b) || b < (10u << 20) || b > (1ull << 30) || b % (2u << 20)) return false;
         c->large_segment = b;
         return true;
       }},
      {"GPUSHIM_MAX_SPLIT", "bytes, more than GPUSHIM_LARGE_SEGMENT (20MiB), or none", "none",
       "Caching policy: free blocks this large are never split for smaller requests (like PyTorch's "
       "max_split_size_mb), which keeps big blocks whole for big tensors.",
       [](std::string_view v, Config* c) {
         if (iequals(trim(v), "none")) return c->max_split = UINT64_MAX, true;
         uint64_t b = 0;
         // Compared with GPUSHIM_LARGE_SEGMENT once every variable is read (add_contradictions).
         if (!parse_bytes(v, &b) || b < (2u << 20)) return false;
         c->max_split = b;
         return true;
       }},
      {"GPUSHIM_QUARANTINE", "bytes with units, 0 to 1TiB", "256KiB",
       "Pooling policies: memory freed with cudaFree is reusable once the work issued before the free has "
       "finished, which the pool learns from events on every stream, recorded once per this many freed bytes "
       "(or sooner, when the pool needs the memory) and queried without waiting; the device is synchronized "
       "only when memory is short. 0 records them at every free.",
       [](std::string_view v, Config* c) {
         uint64_t b = 0;
         if (!parse_bytes(v, &b) || b > (1ull << 40)) return false;
         c->quarantine_bytes = b;
         return true;
       }},
      {"GPUSHIM_VMM_REUSE", "stream-order or idle", "stream-order",
       "vmm policy: when no free block fits, a block is built from free memory around it and mapped pieces; "
       "stream-order also uses memory freed on the requesting stream whose work is still queued (the stream "
       "runs that work first), in place or mapped a second time where the block needs it, and waits for the "
       "oldest closed fence rather than carve around cudaFree'd blocks; idle only memory the device has "
       "finished with, and carves (the pool before 2026-11-27; replays of traces recorded before then use it).",
       [](std::string_view v, Config* c) {
         const std::string_view t = trim(v);
         if (iequals(t, "stream-order")) return c->vmm_stream_order_builds = true, true;
         if (iequals(t, "idle")) return c->vmm_stream_order_builds = false, true;
         return false;
       }},
      {"GPUSHIM_OWN_SEGMENT_MIN", "bytes with units (2MiB, 512KiB), or off", "off",
       "Pooling policies: allocations at least this large get a driver segment of their own, never shared "
       "or cached, so legacy CUDA IPC (cudaIpcGetMemHandle) exports exactly their bytes. Other blocks of a "
       "pool are refused for IPC unless they start their segment.",
       [](std::string_view v, Config* c) {
         if (iequals(trim(v), "off")) return c->own_segment_min = 0, true;
         uint64_t b = 0;
         if (!parse_bytes(v, &b) || b == 0) return false;
         c->own_segment_min = b;
         return true;
       }},
      {"GPUSHIM_SAMPLE_MS", "an integer 1..60000", "100",
       "Interval of the allocated/reserved time series in the report (samples are taken on allocation "
       "calls, at most this often; long runs are thinned to stay bounded).",
       [](std::string_view v, Config* c) {
         uint64_t n;
         if (!parse_uint(v, 60000, &n) || n == 0) return false;
         c->sample_ms = static_cast<unsigned>(n);
         return true;
       }},
      {"GPUSHIM_STACK_DEPTH", "an integer 0..256", "32",
       "Native frames captured per allocation (Python frames come in addition, up to 128); 0 turns stack "
       "capture off, Python frames included.",
       [](std::string_view v, Config* c) {
         uint64_t n;
         if (!parse_uint(v, 256, &n)) return false;
         c->stack_depth = static_cast<unsigned>(n);
         return true;
       }},
      {"GPUSHIM_REPORT", "a path template (%p pid, %h host, %r RANK, %% percent), or off", "gpushim.<exe>.<pid>.json",
       "Where the JSON report is written at exit. An existing file is never overwritten: a suffix is added.",
       [](std::string_view v, Config* c) {
         std::string_view t = trim(v);
         if (t.empty()) return false;
         if (iequals(t, "off") || t == "0") return c->report_enabled = false, true;
         c->report_template = std::string(v);
         return true;
       }},
      {"GPUSHIM_TRACE", "a path template (%p pid, %h host, %r RANK, %% percent), on, or off", "off",
       "Records every allocation, free, segment, OOM and iteration mark to a compact binary trace for "
       "gpushim-analyze (replay, export, plots). on: gpushim.<exe>.<pid>.trace in the working directory. "
       "An existing file is never overwritten: a suffix is added.",
       [](std::string_view v, Config* c) {
         std::string_view t = trim(v);
         if (t.empty()) return false;
         if (iequals(t, "off") || t == "0") return c->trace_enabled = false, true;
         c->trace_enabled = true;
         c->trace_template = (iequals(t, "on") || t == "1") ? std::string() : std::string(v);
         return true;
       }},
      {"GPUSHIM_SUMMARY", "an integer 0..1000", "5",
       "Live sites shown in the stderr summary at exit; 0 turns the summary off.",
       [](std::string_view v, Config* c) {
         uint64_t n;
         if (!parse_uint(v, 1000, &n)) return false;
         c->summary_sites = static_cast<unsigned>(n);
         return true;
       }},
      {"GPUSHIM_METRICS",
       "a path template (%p pid, %h host, %r RANK, %% percent; ending in / : gpushim.<exe>.<pid>.prom in that "
       "directory), or off",
       "off",
       "Prometheus text-format file (name it *.prom for node_exporter's textfile collector) with allocated, "
       "reserved, peak, cap, OOMs and unaccounted per device, replaced atomically every GPUSHIM_SAMPLE_MS while "
       "the process runs and once more at exit.",
       [](std::string_view v, Config* c) {
         std::string_view t = trim(v);
         if (t.empty()) return false;
         if (iequals(t, "off") || t == "0") return c->metrics_template.clear(), true;
         c->metrics_template = std::string(v);
         return true;
       }},
      {"GPUSHIM_SNAPSHOT_SIGNAL", "USR2, USR1 (or SIGUSR2, SIGUSR1), or off", "USR2",
       "Signal that makes the running process write a report (reason \"snapshot\", the report name with "
       ".snapshot.N before its extension) without stopping. Installed at the first CUDA call, and only if the "
       "program has not claimed the signal itself.",
       [](std::string_view v, Config* c) {
         std::string_view t = trim(v);
         if (iequals(t, "off") || t == "0") return c->snapshot_signal = 0, true;
         if (t.size() > 3 && iequals(t.substr(0, 3), "SIG")) t.remove_prefix(3);
         if (iequals(t, "USR2")) return c->snapshot_signal = SIGUSR2, true;
         if (iequals(t, "USR1")) return c->snapshot_signal = SIGUSR1, true;
         return false;
       }},
      {"GPUSHIM_PYTHON_STACKS", "1 or 0 (also on/off, true/false, yes/no)", "1",
       "Capture the Python frames (file, function, line) of the allocating thread along with the native ones, "
       "for CPython 3.9 to 3.13. 0 records native frames only.",
       [](std::string_view v, Config* c) { return parse_bool(v, &c->python_stacks); }},
      {"GPUSHIM_ITERATION_SITE", "a function name: Python (name or qualified name) or native (exported symbol)", "none",
       "A function whose calls count as iterations for the growth report (bytes per iteration), seen as new "
       "activations in allocation stacks (docs/python.md says exactly what counts). gpushim_mark_iteration() is "
       "the exact alternative.",
       [](std::string_view v, Config* c) {
         const std::string_view t = trim(v);
         if (t.empty() || t.size() > 512) return false;
         for (char ch : t)
           if (ch == ' ' || ch == '\t' || static_cast<unsigned char>(ch) < 0x20) return false;
         c->iteration_site = std::string(t);
         return true;
       }},
      {"GPUSHIM_TORCH_ALLOC", "async, no-cache or keep", "async",
       "PyTorch's allocator, chosen by the preloaded library before the program starts (docs/python.md). async: "
       "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, so every tensor is a cudaMallocAsync/cudaFreeAsync the "
       "shim serves; no-cache: PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree); keep: "
       "neither, PyTorch's caching allocator stays in charge. A PYTORCH_* value the user set is always kept.",
       [](std::string_view v, Config* c) {
         if (v.find('\0') != std::string_view::npos) return false;  // never in a real environment
         const std::string s(v);
         return parse_torch_alloc(s.c_str(), &c->torch_alloc);
       }},
      {"GPUSHIM_FAIL",
       "off, or comma-separated clauses: nth:N (the Nth allocation), every:N, random:P (probability 0<P<=1) "
       "with optional seed:S, above:BYTES",
       "off",
       "Fails chosen device allocations on purpose, exactly like a real out-of-memory error "
       "(cudaErrorMemoryAllocation), to test a program's OOM handling; the report marks them as injected. "
       "Allocations are numbered from 1 over the whole process; random decisions depend only on the seed and "
       "that number.",
       [](std::string_view v, Config* c) { return parse_fault_spec(v, &c->fail); }},
      {"GPUSHIM_EXIT_CODE", "an integer 1..255, or off", "off",
       "A CI verdict: a run that would exit with status 0 exits with this status instead when it ends with "
       "growth suspects, invalid frees, or more device memory live than GPUSHIM_EXIT_LEAK_BYTES; one line on "
       "stderr says why. A program's own failure status is kept; a run ended by a signal keeps its signal.",
       [](std::string_view v, Config* c) {
         if (iequals(trim(v), "off")) return c->exit_code = 0, true;
         uint64_t n;
         if (!parse_uint(v, 255, &n) || n == 0) return false;
         c->exit_code = static_cast<int>(n);
         return true;
       }},
      {"GPUSHIM_EXIT_LEAK_BYTES", "bytes with units (0, 1MiB, 2GiB), or off", "off",
       "With GPUSHIM_EXIT_CODE: device memory live at exit (for a Python program, when its interpreter began "
       "its teardown) above this fails the run; 0 fails it on any live byte.",
       [](std::string_view v, Config* c) {
         if (iequals(trim(v), "off")) return c->exit_leak_bytes = UINT64_MAX, true;
         uint64_t b = 0;
         if (trim(v) == "0") return c->exit_leak_bytes = 0, true;
         if (!parse_bytes(v, &b)) return false;
         c->exit_leak_bytes = b;
         return true;
       }},
  };
  return *table;
}

}  // namespace

const char* policy_name(PolicyKind p) {
  switch (p) {
    case PolicyKind::kPassthrough: return "passthrough";
    case PolicyKind::kCaching: return "caching";
    case PolicyKind::kVmm: return "vmm";
  }
  return "unknown";
}

namespace {
// What a message shows of a name or value taken from the environment: printable ASCII as is,
// anything else as \xNN, and at most 64 bytes of it, so that one line stays one readable line
// whatever the environment holds (newlines, escape codes, a megabyte of junk).
std::string shown(const std::string& s) {
  constexpr size_t kMaxShown = 64;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > kMaxShown) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}
}  // namespace

std::string ConfigError::message() const {
  if (unknown_name) return shown(variable) + " is not a gpushim variable (known: " + accepted + ")";
  return variable + "='" + shown(value) + "' is invalid: expected " + accepted;
}

namespace {

// Settings that are each valid but make no sense together are refused too (one line each), not
// silently ignored: the user believes they act.
void add_contradictions(const std::vector<std::pair<std::string, std::string>>& vars, ConfigResult* result) {
  auto has_error = [&](const std::string& name) {
    for (const ConfigError& e : result->errors)
      if (e.variable == name) return true;
    return false;
  };
  static constexpr const char* kPoolSettings[] = {"GPUSHIM_ROUND", "GPUSHIM_SMALL_SEGMENT", "GPUSHIM_LARGE_SEGMENT",
                                                  "GPUSHIM_MAX_SPLIT", "GPUSHIM_QUARANTINE", "GPUSHIM_OWN_SEGMENT_MIN",
                                                  "GPUSHIM_VMM_REUSE"};
  std::string small_value, large_value, split_value;
  for (const auto& [name, value] : vars) {
    if (name == "GPUSHIM_SMALL_SEGMENT") small_value = value;
    if (name == "GPUSHIM_LARGE_SEGMENT") large_value = value;
    if (name == "GPUSHIM_MAX_SPLIT") split_value = value;
  }
  // PyTorch refuses a max_split_size_mb of its 20 MB segments or less, and so do we: a medium
  // request takes a large segment, which, at or above max_split, is never split for it nor reused
  // for another request below max_split, so each such request would hold a segment of its own.
  if (result->config.max_split <= result->config.large_segment && !has_error("GPUSHIM_MAX_SPLIT") &&
      !has_error("GPUSHIM_LARGE_SEGMENT")) {
    // The reason names the segment size in force: PyTorch's 20 MB only when that is the default.
    result->errors.push_back(
        {"GPUSHIM_MAX_SPLIT", split_value,
         large_value.empty()
             ? std::string("more than GPUSHIM_LARGE_SEGMENT (20MiB), or none, as PyTorch's max_split_size_mb must "
                           "exceed its 20 MB segments")
             : "more than GPUSHIM_LARGE_SEGMENT (" + large_value +
                   "), or none: a free block that large is never split, so each large segment would serve one "
                   "request"});
  }
  if (result->config.policy == PolicyKind::kPassthrough && !has_error("GPUSHIM_POLICY")) {
    for (const auto& [name, value] : vars) {
      bool pool_setting = false;
      for (const char* p : kPoolSettings) pool_setting = pool_setting || name == p;
      std::string v = value;
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const bool means_unused = v.find("off") != std::string::npos || v.find("none") != std::string::npos;
      if (!pool_setting || means_unused || has_error(name)) continue;
      result->errors.push_back({name, value,
                                "a setting of the pools, which GPUSHIM_POLICY=passthrough does not have (use caching "
                                "or vmm, or unset it)"});
    }
  }
  // The two pools share rounding, quarantine and own segments; the segment sizes are the caching
  // pool's (the vmm pool maps 2 MiB chunks), and the reuse rule for built blocks is the vmm pool's.
  if (result->config.policy != PolicyKind::kPassthrough && !has_error("GPUSHIM_POLICY")) {
    const bool vmm = result->config.policy == PolicyKind::kVmm;
    static constexpr const char* kCachingOnly[] = {"GPUSHIM_SMALL_SEGMENT", "GPUSHIM_LARGE_SEGMENT",
                                                   "GPUSHIM_MAX_SPLIT"};
    for (const auto& [name, value] : vars) {
      if (has_error(name)) continue;
      bool caching_only = false;
      for (const char* c : kCachingOnly) caching_only = caching_only || name == c;
      if (vmm && caching_only)
        result->inert.push_back(name + "=" + value + " has no effect: it sets the caching policy's segments, and "
                                "GPUSHIM_POLICY=vmm maps 2 MiB chunks");
      if (!vmm && name == "GPUSHIM_VMM_REUSE")
        result->inert.push_back(name + "=" + value + " has no effect: it sets the vmm policy, and the policy is " +
                                policy_name(result->config.policy) + " (GPUSHIM_POLICY=vmm uses it)");
    }
  }
  // A threshold for an exit status nobody asked for.
  if (result->config.exit_code == 0 && result->config.exit_leak_bytes != UINT64_MAX && !has_error("GPUSHIM_EXIT_CODE") &&
      !has_error("GPUSHIM_EXIT_LEAK_BYTES"))
    for (const auto& [name, value] : vars)
      if (name == "GPUSHIM_EXIT_LEAK_BYTES")
        result->inert.push_back(name + "=" + value + " has no effect: it is the live-memory threshold of "
                                "GPUSHIM_EXIT_CODE, which is off (set GPUSHIM_EXIT_CODE to an exit status)");
  if (result->config.small_segment > result->config.large_segment && !has_error("GPUSHIM_SMALL_SEGMENT") &&
      !has_error("GPUSHIM_LARGE_SEGMENT")) {
    const bool small_given = !small_value.empty();
    result->errors.push_back({small_given ? "GPUSHIM_SMALL_SEGMENT" : "GPUSHIM_LARGE_SEGMENT",
                              small_given ? small_value : large_value,
                              small_given ? "at most GPUSHIM_LARGE_SEGMENT (" +
                                                (large_value.empty() ? std::string("20MiB") : large_value) + ")"
                                          : "at least GPUSHIM_SMALL_SEGMENT (" + small_value + ")"});
  }
}

// Read by the project's own tools and tests, never by the shim: set in a job's environment (the
// launcher, gpushim-plot, gpu-validate and the test harness pass them down), they must not turn the
// shim off as an unknown name would. tests/e2e/test_docs_match_help.py keeps this list equal to
// the GPUSHIM_* names the tree reads from the environment that are not the shim's.
bool tool_variable(const std::string& name) {
  static constexpr const char* kNames[] = {
      "GPUSHIM_ANALYZE",            // gpushim-plot: the gpushim-analyze to run
      "GPUSHIM_ANALYZE_MAX_INPUT",  // gpushim-analyze: the largest input it reads
      "GPUSHIM_BUDGET",             // gpu-run-device: the device time to plan for
      "GPUSHIM_BUILD_DIR",          // the tests: the build tree
      "GPUSHIM_FAKECUDA_DIR",       // tests/fakecuda/README.md: where the simulated device is
      "GPUSHIM_NVCC",               // the tests: nvcc for programs built the way nvcc builds
      "GPUSHIM_PROMTOOL",           // the tests and the bundle: Prometheus's checker
      "GPUSHIM_PYTHON",             // gpushim-plot, gpu-run-device, gpu-validate: the Python to use
      "GPUSHIM_REC_OUT",            // bench/record: where recorded traces go
      "GPUSHIM_RMM_SOURCE",         // scripts/bench --rmm: RMM's source
      "GPUSHIM_SPEEDSCOPE",         // the tests and the bundle: speedscope's checker
  };
  if (name.rfind("GPUSHIM_TEST_", 0) == 0) return true;  // the test harness's own
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

}  // namespace

ConfigResult parse_config(const std::vector<std::pair<std::string, std::string>>& vars) {
  ConfigResult result;
  for (const auto& [name, value] : vars) {
    if (name.rfind("GPUSHIM_", 0) != 0 || tool_variable(name)) continue;
    const Variable* var = nullptr;
    for (const Variable& v : variables())
      if (name == v.name) var = &v;
    if (var == nullptr) {
      // Unknown name: list what exists, since the likeliest cause is a typo.
      std::string known;
      for (const Variable& v : variables()) known += (known.empty() ? "" : ", ") + std::string(v.name);
      result.errors.push_back({name, value, known, /*unknown_name=*/true});
      continue;
    }
    if (!var->apply(value, &result.config)) result.errors.push_back({name, value, var->accepted});
  }
  add_contradictions(vars, &result);
  return result;
}

ConfigResult parse_config(const char* const* env) {
  std::vector<std::pair<std::string, std::string>> vars;
  for (const char* const* e = env; e && *e; ++e) {
    if (std::strncmp(*e, "GPUSHIM_", 8) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    vars.emplace_back(std::string(*e, eq), std::string(eq + 1));
  }
  return parse_config(vars);
}

std::vector<ConfigVariableDoc> config_variable_docs() {
  std::vector<ConfigVariableDoc> docs;
  for (const Variable& v : variables()) docs.push_back({v.name, v.accepted, v.default_value, v.description});
  return docs;
}

}  // namespace gpushim
