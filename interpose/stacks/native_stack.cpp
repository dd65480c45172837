#include "stacks/native_stack.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <ucontext.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "util/log.h"
#include "util/dlopen_guard.h"

namespace gpushim {
namespace {

// Fixed upper bound so the hot path can unwind into a buffer on its own stack (no allocation).
constexpr size_t kMaxFrames = 256;

using BacktraceFn = int (*)(void** buffer, int size);

enum class Unwinder : int { kUnknown = 0, kLibunwind, kGlibc, kNone };

std::atomic<int> g_state{static_cast<int>(Unwinder::kUnknown)};
// Written once under g_once before g_state is published with release ordering.
BacktraceFn g_backtrace = nullptr;
// Frames at the top of the unwinder's answer that belong to the capturing function itself
// (libunwind and glibc differ, and libunwind versions have differed); measured at init.
size_t g_own_frames = 1;
std::once_flag g_once;

// libunwind's cursor API, for trace_native_frames (the frame-by-frame walk that says where each
// frame's return address and frame pointer were read from). Declared here because Debian's
// libunwind-dev is not a dependency; the layouts are those of libunwind-x86_64.h (1.3 to 1.8).
struct UnwCursor {
  uint64_t opaque[127];  // UNW_TDEP_CURSOR_LEN
};
struct UnwSaveLoc {
  int type;  // UNW_SLT_NONE 0, UNW_SLT_MEMORY 1, UNW_SLT_REG 2
  union {
    uint64_t addr;
    int regnum;
  } u;
  char extra[8];
};
constexpr int kUnwRbp = 6, kUnwRsp = 7, kUnwRip = 16, kUnwSltMemory = 1;
struct CursorApi {
  int (*getcontext)(ucontext_t*) = nullptr;
  int (*init_local)(UnwCursor*, ucontext_t*) = nullptr;
  int (*step)(UnwCursor*) = nullptr;
  int (*get_reg)(UnwCursor*, int, uint64_t*) = nullptr;
  int (*get_save_loc)(UnwCursor*, int, UnwSaveLoc*) = nullptr;
  int (*is_signal_frame)(UnwCursor*) = nullptr;
};
CursorApi g_cursor;  // written once under g_once, before g_state is published
bool g_cursor_ok = false;

void load_cursor_api(void* h) {
  CursorApi c;
  c.getcontext = reinterpret_cast<decltype(c.getcontext)>(dlsym(h, "_Ux86_64_getcontext"));
  c.init_local = reinterpret_cast<decltype(c.init_local)>(dlsym(h, "_ULx86_64_init_local"));
  c.step = reinterpret_cast<decltype(c.step)>(dlsym(h, "_ULx86_64_step"));
  c.get_reg = reinterpret_cast<decltype(c.get_reg)>(dlsym(h, "_ULx86_64_get_reg"));
  c.get_save_loc = reinterpret_cast<decltype(c.get_save_loc)>(dlsym(h, "_ULx86_64_get_save_loc"));
  c.is_signal_frame = reinterpret_cast<decltype(c.is_signal_frame)>(dlsym(h, "_ULx86_64_is_signal_frame"));
  g_cursor = c;
  g_cursor_ok = c.getcontext && c.init_local && c.step && c.get_reg && c.get_save_loc && c.is_signal_frame;
}

// glibc's backtrace() already matches BacktraceFn; wrapped so both paths share one pointer.
int glibc_backtrace(void** buffer, int size) { return ::backtrace(buffer, size); }

// Mirrors capture_native_stack's shape (one unwinder call through g_backtrace in a noinline
// function) and reports where our caller's return address shows up in the unwinder's output.
__attribute__((noinline)) size_t measure_own_frames() {
  void* buf[8];
  const int n = g_backtrace(buf, 8);
  void* const ours = __builtin_return_address(0);
  for (int i = 0; i < n; ++i)
    if (buf[i] == ours) return static_cast<size_t>(i);
  return 1;  // not found (e.g. a frame elided): the common answer for both unwinders
}

// ThreadSanitizer's runtime (in an instrumented host or in a TSan build of ours) tears a thread's
// state down in a thread-specific-data destructor that can run before libunwind's per-thread
// trace-cache destructor, whose mutex lock then crashes inside the TSan interceptor (seen with
// libunwind 1.6 and GCC 12's TSan). glibc's unwinder keeps no such per-thread state.
bool tsan_runtime_present() {
#if defined(__SANITIZE_THREAD__)
  return true;
#else
  return dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr;
#endif
}

void load_unwinder() {
  // RTLD_LOCAL keeps libunwind's _Unwind_* out of the global scope, where they would capture the
  // host's C++ exception handling (design-notes §2). Never link it.
  void* h = tsan_runtime_present() ? nullptr : guarded_dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (h != nullptr) {
    // Debian exports the plain name; some builds only carry the target-prefixed one.
    void* sym = dlsym(h, "unw_backtrace");
    if (sym == nullptr) sym = dlsym(h, "_ULx86_64_unw_backtrace");
    if (sym != nullptr) {
      g_backtrace = reinterpret_cast<BacktraceFn>(sym);
#if defined(__x86_64__)
      load_cursor_api(h);
#endif
      g_own_frames = measure_own_frames();
      g_state.store(static_cast<int>(Unwinder::kLibunwind), std::memory_order_release);
      return;
    }
    // Left loaded: unloading runs its finalizers, which unregister fork handlers under glibc's
    // fork-handler lock, while a fork in another thread may hold that lock and wait for the
    // initialization lock this runs under (a deadlock). An unused RTLD_LOCAL library costs nothing.
  }
  // glibc's backtrace is ~15x slower but always there. Its first call dlopens libgcc_s (and so
  // allocates); doing that here keeps later captures allocation-free.
  g_backtrace = glibc_backtrace;
  void* warm[4];
  int warmed = 0;
  {
    const LoaderScope scope;  // glibc's own dlopen of libgcc_s, which fork must not split either
    warmed = g_backtrace(warm, 4);
  }
  if (warmed <= 0) {
    g_backtrace = nullptr;
    log_line("no stack unwinder available (libunwind.so.8 and glibc backtrace failed); stacks are off");
    g_state.store(static_cast<int>(Unwinder::kNone), std::memory_order_release);
    return;
  }
  g_own_frames = measure_own_frames();
  if (!tsan_runtime_present())
    log_line("libunwind.so.8 not usable; falling back to glibc backtrace() (slower stack capture)");
  g_state.store(static_cast<int>(Unwinder::kGlibc), std::memory_order_release);
}

}  // namespace

bool init_native_unwinder() {
  int s = g_state.load(std::memory_order_acquire);
  if (s == static_cast<int>(Unwinder::kUnknown)) {
    std::call_once(g_once, load_unwinder);
    s = g_state.load(std::memory_order_acquire);
  }
  return s == static_cast<int>(Unwinder::kLibunwind) || s == static_cast<int>(Unwinder::kGlibc);
}

// noinline: the frame accounting measured by measure_own_frames assumes this is a real frame.
__attribute__((noinline)) size_t capture_native_stack(uint64_t* out, size_t max_depth, size_t skip) {
  if (max_depth == 0) return 0;
  if (__builtin_expect(g_state.load(std::memory_order_acquire) == static_cast<int>(Unwinder::kUnknown), 0))
    init_native_unwinder();
  const BacktraceFn bt = g_backtrace;
  if (bt == nullptr) return 0;

  const size_t drop = g_own_frames + skip;
  if (drop >= kMaxFrames) return 0;
  size_t want = drop + max_depth;
  if (want > kMaxFrames) want = kMaxFrames;

  void* buf[kMaxFrames];
  int got = 0;
  {
    // On a miss in its caches, libunwind (and glibc's unwinder) walks the loaded objects with
    // dl_iterate_phdr, under the loader's lock: a fork must not split that (util/dlopen_guard.h).
    // Captures the stack cache answers never get here.
    const LoaderScope loader_work;
    got = bt(buf, static_cast<int>(want));
  }
  if (got <= 0 || static_cast<size_t>(got) <= drop) return 0;
  const size_t n = static_cast<size_t>(got) - drop;
  for (size_t i = 0; i < n; ++i) out[i] = reinterpret_cast<uintptr_t>(buf[drop + i]);
  return n;
}

bool native_trace_available() {
  return init_native_unwinder() && g_state.load(std::memory_order_acquire) == static_cast<int>(Unwinder::kLibunwind) &&
         g_cursor_ok;
}

__attribute__((noinline)) size_t trace_native_frames(NativeFrameTrace* out, size_t max) {
  if (!native_trace_available() || max == 0) return 0;
  const LoaderScope loader_work;  // libunwind's steps may walk the loaded objects, as above
  ucontext_t ctx;
  UnwCursor cursor;
  if (g_cursor.getcontext(&ctx) != 0 || g_cursor.init_local(&cursor, &ctx) != 0) return 0;
  // Frame 0 is this function: skipped, so that out[0] is our caller.
  if (g_cursor.step(&cursor) <= 0) return 0;
  size_t n = 0;
  for (;;) {
    NativeFrameTrace& f = out[n];
    f = NativeFrameTrace{};
    UnwSaveLoc loc{};
    if (g_cursor.get_reg(&cursor, kUnwRip, &f.ip) != 0 || g_cursor.get_reg(&cursor, kUnwRsp, &f.sp) != 0 ||
        g_cursor.get_reg(&cursor, kUnwRbp, &f.rbp) != 0)
      break;
    if (g_cursor.get_save_loc(&cursor, kUnwRip, &loc) == 0 && loc.type == kUnwSltMemory) f.ip_slot = loc.u.addr;
    loc = UnwSaveLoc{};
    if (g_cursor.get_save_loc(&cursor, kUnwRbp, &loc) == 0 && loc.type == kUnwSltMemory) f.rbp_slot = loc.u.addr;
    f.signal_frame = g_cursor.is_signal_frame(&cursor) > 0;
    ++n;
    if (n == max) break;
    const int r = g_cursor.step(&cursor);
    if (r <= 0) {
      if (r < 0) out[n - 1].step_failed = true;
      break;
    }
  }
  return n;
}

}  // namespace gpushim
