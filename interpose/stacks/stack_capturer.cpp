#include "stacks/stack_capturer.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <atomic>

#include "stacks/iteration_site.h"
#include "python/python_frame_walker.h"
#include "stacks/native_stack.h"
#include "stacks/stack_cache.h"
#include "stacks/stack_merge.h"
#include "util/log.h"

namespace gpushim {
namespace {

constexpr size_t kSlack = 4;  // room for the shim's own frames (2-3 with inlining), trimmed after the unwind

// The calling thread's previous allocation, as the iteration-site detection saw it.
thread_local SiteActivation t_last_activation;

// Tells capturers apart in the per-thread stack caches, including one created where a destroyed
// one was (its ids belong to another StackTable).
std::atomic<uint64_t> g_next_cache_owner{1};

}  // namespace

StackCapturer::StackCapturer(StackCaptureOptions options, StackTable* table, IterationCounter* iterations)
    : options_(std::move(options)),
      table_(table),
      iterations_(iterations),
      cache_(options_.cache && native_trace_available()),
      cache_owner_(g_next_cache_owner.fetch_add(1, std::memory_order_relaxed)) {
  if (!options_.python) {
    python_status_ = "off";
  } else {
    PythonDetection d = detect_python();
    switch (d.support) {
      case PythonSupport::kAbsent: break;
      case PythonSupport::kUnsupported:
        python_status_ = "unsupported: " + d.reason;
        log_line("%s; stacks show native frames only", d.reason.c_str());
        break;
      case PythonSupport::kSupported:
        python_ = std::move(d.runtime);
        code_table_ = std::make_unique<PythonCodeTable>(python_, options_.iteration_site);
        calls_ = PythonCallCounter::create(python_, options_.iteration_site, iterations_);
        python_status_ = python_.version;
        break;
    }
  }
  if (!options_.iteration_site.empty()) {
    // A native iteration site is an exported symbol (extern "C", or a mangled C++ name).
    void* fn = dlsym(RTLD_DEFAULT, options_.iteration_site.c_str());
    Dl_info info{};
    ElfW(Sym)* sym = nullptr;
    if (fn != nullptr && dladdr1(fn, &info, reinterpret_cast<void**>(&sym), RTLD_DL_SYMENT) != 0 && sym != nullptr &&
        ELF64_ST_TYPE(sym->st_info) == STT_FUNC && sym->st_size > 0) {
      native_site_begin_ = reinterpret_cast<uintptr_t>(fn);
      native_site_end_ = native_site_begin_ + sym->st_size;
    }
  }
}

size_t StackCapturer::skip_own_frames(const uint64_t* buf, size_t n) const {
  size_t skip = 0;
  while (skip < n && buf[skip] >= options_.skip_begin && buf[skip] < options_.skip_end) ++skip;
  return skip;
}

void StackCapturer::observe(const SiteActivation& cur) {
  if (starts_new_activation(t_last_activation, cur) && iterations_ != nullptr) iterations_->add(IterationCounter::kSite);
  t_last_activation = cur;
}

void StackCapturer::observe_native_site(const uint64_t* native, size_t n) {
  SiteActivation cur;
  for (size_t i = n; i-- > 0;) {  // outermost first
    if (native[i] > native_site_begin_ && native[i] <= native_site_end_) {
      cur.kind = SiteActivation::kNative;
      cur.position = static_cast<int64_t>(native[i]);
      break;
    }
  }
  observe(cur);
}

// noinline, and a frame pointer (__builtin_frame_address): the stack cache keys on this function's
// frame address and traces the stack from here, so it must be one real frame on every path.
__attribute__((noinline)) StackId StackCapturer::capture(bool allocation) {
  const size_t depth = options_.native_depth;
  if (depth == 0) return kEmptyStack;
  const bool watch_site = allocation && !options_.iteration_site.empty();

  // Left uninitialized: PyFrameRef's member initializers would fill all kMaxPythonFrames (3 KiB)
  // on every capture, which cost more than the rest of a 32-frame capture outside the unwinder.
  // The walker writes every field of the frames it returns; nothing past them is read.
  union PyFrames {
    PyFrames() {}
    PyFrameRef frames[kMaxPythonFrames];
  } py_storage;
  PyFrameRef* const py = py_storage.frames;
  const size_t n_py = code_table_ ? walk_python_frames(python_, py, kMaxPythonFrames) : 0;

  // The iteration-site watch reads every capture's frames: it bypasses the cache.
  ThreadStackCache* const cache = cache_ && !watch_site ? ThreadStackCache::acquire() : nullptr;
  const ThreadStackCache::Probe probe{cache_owner_, reinterpret_cast<uintptr_t>(__builtin_frame_address(0)), py, n_py,
                                      n_py ? python_.layout : nullptr};
  if (cache != nullptr) {
    StackId hit;
    if (cache->find(probe, &hit)) {
      cache->release();
      return hit;
    }
  }

  uint64_t native[kMaxNativeUnwind + kSlack];
  const size_t want = n_py ? kMaxNativeUnwind + kSlack : std::min<size_t>(depth + kSlack, kMaxNativeUnwind + kSlack);
  const size_t got = capture_native_stack(native, want, 0);
  const size_t skip = skip_own_frames(native, got);
  const uint64_t* own = native + skip;
  const size_t n_native = got - skip;

  // A miss: a stack met again among the recent misses of its key's set is traced once (here, in
  // this frame, as the cache requires) and cached.
  auto remember = [&](StackId id) {
    if (cache == nullptr) return id;
    if (cache->seen_twice(probe, id)) {
      NativeFrameTrace* trace = cache->trace_buffer();
      const size_t n_trace = trace_native_frames(trace, ThreadStackCache::kMaxNativeTraceFrames);
      cache->insert(probe, trace, n_trace, native, got, want, id);
    }
    cache->release();
    return id;
  };

  if (n_py == 0) {
    if (watch_site) observe_native_site(own, n_native);
    return remember(table_->intern(own, std::min(n_native, depth)));
  }

  PythonStackWord words[kMaxPythonFrames];
  const bool eval_size_known = python_.eval_end > python_.eval_begin;
  size_t site_frame = SIZE_MAX;
  for (size_t i = 0; i < n_py; ++i) {
    bool is_site = false;
    words[i].word = make_python_frame(code_table_->location(py[i].code, py[i].byte_offset, &is_site));
    // Without the eval loop's extent, all Python frames go where the interpreter's frames start.
    words[i].ends_eval_call = eval_size_known ? py[i].ends_eval_call : i + 1 == n_py;
    if (is_site) site_frame = i;  // the last one seen is the outermost
  }
  if (watch_site) {
    if (site_frame != SIZE_MAX && calls_ != nullptr && calls_->counts_calls_of(py[site_frame].code)) {
      // The interpreter counts this function's calls itself.
    } else if (site_frame != SIZE_MAX) {
      SiteActivation cur;
      cur.kind = SiteActivation::kPython;
      cur.frame = py[site_frame].frame;
      cur.position = py[site_frame].byte_offset;
      cur.nargs = static_cast<uint8_t>(read_python_arguments(python_, py[site_frame], cur.args, SiteActivation::kMaxArgs));
      observe(cur);
    } else {
      observe_native_site(own, n_native);
    }
  }

  auto role = [this, eval_size_known](uint64_t pc) {
    if (!python_.is_interpreter_frame(pc)) return NativeFrameRole::kOther;
    if (eval_size_known ? python_.is_eval_frame(pc) : true) return NativeFrameRole::kEvalLoop;
    return NativeFrameRole::kInterpreter;
  };
  uint64_t merged[kMaxNativeUnwind + kMaxPythonFrames];
  const size_t m = interleave_python_frames(own, n_native, words, n_py, role, std::min<size_t>(depth, kMaxNativeUnwind),
                                            kMaxPythonFrames, merged);
  return remember(table_->intern(merged, m));
}

size_t StackCapturer::memory_bytes() const {
  // The per-thread stack caches are counted here, by the one capturer that uses them.
  return (code_table_ ? code_table_->memory_bytes() : 0) + (cache_ ? ThreadStackCache::total_bytes() : 0);
}

bool StackCapturer::resolve_python(uint32_t id, FrameInfo* out) const {
  PythonLocation loc;
  if (code_table_ == nullptr || !code_table_->resolve(id, &loc)) return false;
  out->function = std::move(loc.function);
  out->file = std::move(loc.file);
  out->line = loc.line;
  return true;
}

}  // namespace gpushim
