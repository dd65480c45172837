// The front's one job: find libgpushim-core.so next to itself and load it at the first CUDA call,
// so that a process that never calls CUDA maps nothing but this small library (issue 30: the C++
// runtime, Abseil and the core's constructors doubled the start-up of /bin/true).
//
// Should the core fail to load (a copied libgpushim.so without its core, say), every call goes to
// the real CUDA function unobserved, after one line on stderr: never a crash, never a wrong answer.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "front/front.h"
#include "public/gpushim.h"
#include "util/no_write_signals.h"
#include "util/version.h"  // the tag `gpushim --version` reads from the preloaded file

namespace {

// The exported names, one after another, each ended by its '\0': an array of pointers would be a
// relocation per name, work for the loader in every preloaded process (issue 30).
#define GPUSHIM_FRONT_SYMBOL(index, name) #name "\0"
constexpr char kNames[] =
#include "front_symbols.inc"
    ;
#undef GPUSHIM_FRONT_SYMBOL
constexpr unsigned kNameCount = GPUSHIM_FRONT_SYMBOLS;

// The name of trampoline `index`: a walk along kNames, only on the paths that load the core.
const char* name_at(unsigned index) {
  const char* name = kNames;
  for (; index > 0; --index) name += strlen(name) + 1;
  return name;
}

using DlsymFn = void* (*)(void*, const char*);

DlsymFn g_real_dlsym = nullptr;
GpushimCoreSubstitute g_substitute = nullptr;
enum LoadState { kNotYet, kCore, kNoCore };
int g_loaded = kNotYet;  // kCore, kNoCore: the slots hold what they will hold
int g_warned = 0;

// What load_core needs, set up by the initializer, or by the first call if a library's constructor
// calls CUDA before ours has run. 0: not yet; 1: being published; 2: set up.
int g_setup = 0;
// This library's path, fixed early: LD_PRELOAD may name it by a relative path, and the program may
// change directory before its first CUDA call. The core is looked for beside it. Null: found by
// the loader's search (no slash in the name), as the core then is. An absolute name is the
// loader's own copy, which lives as long as this library (never unloaded); only a relative one is
// made absolute, into pages mapped for it: a buffer among the front's variables, written or not,
// would be one more mapping the loader makes in every preloaded process (issue 30).
const char* g_self_path = nullptr;
GpushimFront g_table;        // what the core is lent (front_api.h)

// fork() while another thread is inside dlopen of the core would give the child a half-loaded
// library and the loader's state in mid-change (the child's own dlopen then crashes or hangs). The
// prepare handler waits for loads in flight, and loads wait while a fork is being prepared.
int g_loads_in_flight = 0;
int g_forking = 0;

// The core's fork handlers (GpushimFront::atfork), run as glibc runs its own: prepare handlers in
// the reverse order of registration, the others in order.
struct ForkHandlers {
  void (*prepare)();
  void (*parent)();
  void (*child)();
};
constexpr int kMaxForkHandlers = 8;
ForkHandlers g_fork_handlers[kMaxForkHandlers];
int g_fork_handler_count = 0;  // published after the entry is written

int core_atfork(void (*prepare)(), void (*parent)(), void (*child)()) {
  // Registrations come from the core's one-time set-up; a slot is claimed, filled, then published
  // in order (a later claim waits for the earlier publication).
  static int claimed = 0;
  const int i = __atomic_fetch_add(&claimed, 1, __ATOMIC_ACQ_REL);
  if (i >= kMaxForkHandlers) return 12;  // ENOMEM, as pthread_atfork says when it cannot register
  g_fork_handlers[i] = ForkHandlers{prepare, parent, child};
  while (__atomic_load_n(&g_fork_handler_count, __ATOMIC_ACQUIRE) != i) sched_yield();
  __atomic_store_n(&g_fork_handler_count, i + 1, __ATOMIC_RELEASE);
  return 0;
}

// How many of them the fork in progress prepared: only those get their parent and child handlers
// (a core attached while the fork was being prepared must not unlock what it never locked).
int g_prepared_handlers = 0;

void run_core_prepare(int from, int to) {
  for (int i = to - 1; i >= from; --i)
    if (g_fork_handlers[i].prepare) g_fork_handlers[i].prepare();
}
void run_core_after(bool child) {
  for (int i = 0; i < g_prepared_handlers; ++i)
    if (void (*fn)() = child ? g_fork_handlers[i].child : g_fork_handlers[i].parent) fn();
}

// The core's hot per-thread state (front_api.h): initial-exec in the preloaded front, so it is part
// of every thread's static TLS from the start.
__attribute__((tls_model("initial-exec"), aligned(16))) thread_local unsigned char
    t_core_block[kGpushimFrontThreadBlockBytes];

void* no_dlsym(void*, const char*) { return nullptr; }

// glibc 2.34 moved dlsym into libc and gave it a new version; older ones only have the base
// version of their architecture (2.2.5 on x86-64, 2.17 on aarch64).
DlsymFn find_real_dlsym() {
  static constexpr char kVersions[][12] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};  // no relocations
  for (const char* version : kVersions)
    if (void* f = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<DlsymFn>(f);
  return &no_dlsym;
}

// Called by the core for the symbols after the preload: RTLD_NEXT from here, as the front is what
// LD_PRELOAD placed in the global scope. glibc takes "here" from its caller's return address, so
// the lookups must be real calls made from this library: compiled as tail calls (as -O2 did, and
// the core's caller too), glibc saw the core, loaded RTLD_LOCAL, and searched only its own
// dependencies; a runtime other than libcudart.so.13 (CUDA 12's libcudart.so.12, a renamed copy
// in a wheel) was then never found, and every runtime call failed.
void* next_symbol(const char* name, const char* version) {
  void* f = version != nullptr ? dlvsym(RTLD_NEXT, name, version) : gpushim::front::real_dlsym(RTLD_NEXT, name);
  __asm__ volatile("" : "+r"(f));  // work after the calls: they cannot become tail calls
  return f;
}

// What a function answers when neither the core nor CUDA has it: CUDA's "unknown error" (999 in
// both the runtime's and the driver's numbering), or the public API's "shim not active".
int unavailable() { return 999; }
int no_device_stats(int, gpushim_device_stats*) { return -1; }
unsigned long long no_count() { return 0; }

void* inactive_answer(const char* name) {
  if (strcmp(name, "gpushim_get_device_stats") == 0) return reinterpret_cast<void*>(&no_device_stats);
  return reinterpret_cast<void*>(&no_count);
}
bool is_public_api(const char* name) { return strncmp(name, "gpushim_", 8) == 0; }

void warn_once(const char* path, const char* why) {
  if (__atomic_exchange_n(&g_warned, 1, __ATOMIC_ACQ_REL) != 0) return;
  char line[PATH_MAX + 512];
  const int n = snprintf(line, sizeof line, "gpushim: cannot load %s (%s): CUDA calls go to CUDA unobserved\n", path,
                         why ? why : "unknown error");
  const gpushim::ScopedNoWriteSignals no_write_signals;  // a stderr past the file-size limit loses the line only
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n) < sizeof line ? n : sizeof line - 1);
}

// Appends `n` bytes of `s` to `out` (PATH_MAX bytes) at *at; false when it would not fit.
bool append(char* out, size_t* at, const char* s, size_t n) {
  if (*at + n >= PATH_MAX) return false;
  memcpy(out + *at, s, n);
  *at += n;
  out[*at] = '\0';
  return true;
}

// `dir` (its first `len` bytes) + "/" + the core's name into `out`; false when too long.
bool core_beside(char* out, const char* dir, size_t len) {
  size_t at = 0;
  out[0] = '\0';
  return append(out, &at, dir, len) && append(out, &at, "/", 1) &&
         append(out, &at, kGpushimCoreLibrary, sizeof kGpushimCoreLibrary - 1);
}

void begin_load() {
  for (;;) {
    while (__atomic_load_n(&g_forking, __ATOMIC_ACQUIRE) != 0) sched_yield();
    __atomic_add_fetch(&g_loads_in_flight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g_forking, __ATOMIC_SEQ_CST) == 0) return;
    __atomic_sub_fetch(&g_loads_in_flight, 1, __ATOMIC_SEQ_CST);  // a fork came first: let it finish
  }
}
void end_load() { __atomic_sub_fetch(&g_loads_in_flight, 1, __ATOMIC_RELEASE); }

// The name the loader gave this library, made absolute; null when it has no slash or is too long
// (the core is then found by the loader's search, if at all).
const char* absolute_self_path() {
  const char* self = gpushim::front::own_file_name();
  if (self == nullptr || strchr(self, '/') == nullptr) return nullptr;
  if (self[0] == '/') return self;
  void* pages = mmap(nullptr, PATH_MAX, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED) return nullptr;
  char* absolute = static_cast<char*>(pages);
  size_t at = getcwd(absolute, PATH_MAX) != nullptr ? strlen(absolute) : 0;
  // (no "//" when the directory is the root)
  if (at == 0 || (at > 1 && !append(absolute, &at, "/", 1)) || !append(absolute, &at, self, strlen(self))) {
    munmap(pages, PATH_MAX);
    return nullptr;
  }
  return absolute;
}

void setup() {
  if (__atomic_load_n(&g_setup, __ATOMIC_ACQUIRE) == 2) return;
  // One thread computes and publishes, the others wait: two first calls racing (a library's
  // constructor starting threads before ours ran) must not see each other's half-written paths.
  // No PATH_MAX locals: the initializer of every preloaded process runs this, and each page of
  // stack or data it touches is a page fault (issue 30).
  int expected = 0;
  if (__atomic_compare_exchange_n(&g_setup, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    g_self_path = absolute_self_path();
    // The block's offset from the thread pointer is fixed at load time, the same for every thread.
    g_table = GpushimFront{sizeof(GpushimFront), &gpushim::front::real_dlsym, &next_symbol,
                           reinterpret_cast<char*>(t_core_block) - static_cast<char*>(__builtin_thread_pointer()),
                           kGpushimFrontThreadBlockBytes, &core_atfork, &begin_load, &end_load};
    __atomic_store_n(&g_setup, 2, __ATOMIC_RELEASE);
    return;
  }
  // The winner is copying (no lock, no call): wait for it to publish the same values.
  while (__atomic_load_n(&g_setup, __ATOMIC_ACQUIRE) != 2) sched_yield();
}

// Where the core is looked for first: beside this library as it was named (into `out`, PATH_MAX
// bytes), else its bare name for the loader's search.
const char* core_path(char* out) {
  const char* slash = g_self_path ? strrchr(g_self_path, '/') : nullptr;
  if (slash != nullptr && core_beside(out, g_self_path, static_cast<size_t>(slash - g_self_path))) return out;
  return kGpushimCoreLibrary;
}

// The range at the start of a /proc/self/maps line ("lo-hi ..."), read no further than `end`.
// Returns where the range ends, or null when the line does not start with one.
char* parse_range(char* p, const char* end, uintptr_t* lo, uintptr_t* hi) {
  uintptr_t* const values[] = {lo, hi};
  for (uintptr_t* v : values) {
    *v = 0;
    const char* digits = p;
    for (; p < end; ++p) {
      const int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
      if (d < 0) break;
      *v = *v << 4 | static_cast<uintptr_t>(d);
    }
    if (p == digits || p == end || *p != (v == lo ? '-' : ' ')) return nullptr;
    ++p;
  }
  return p;
}

// The path the kernel gives the mapping that holds `addr` (/proc/self/maps), into `out` (PATH_MAX
// bytes): absolute and true whatever the working directory is now, or was when our name was made
// absolute (a library's constructor may change it before ours runs). False without /proc, for a
// deleted file, for a path of PATH_MAX bytes or more, or when no mapping holds `addr`.
// Read through one line-sized buffer on the stack (no malloc: this runs at the first CUDA call,
// wherever that is): a longer line, whatever mapping it is of (a path of PATH_MAX bytes in a deep
// directory, or with newlines, which the kernel writes as four characters each), is passed over.
bool mapped_file_of(const void* addr, char* out) {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[PATH_MAX + 256];  // a line: addresses, permissions, offset, device, inode, path
  size_t have = 0;
  bool eof = false, found = false;
  bool skipping = false;  // inside a line longer than buf, dropped up to its newline
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t lo = 0, hi = 0;
  while (!found) {
    char* nl = static_cast<char*>(memchr(buf, '\n', have));
    if (nl == nullptr) {
      if (have == sizeof buf) {
        // Its start still says which mapping it is: ours has a path too long for `out`.
        if (!skipping && parse_range(buf, buf + have, &lo, &hi) != nullptr && a >= lo && a < hi) break;
        skipping = true;
        have = 0;
      }
      if (eof) break;
      const ssize_t n = read(fd, buf + have, sizeof buf - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) eof = true;
      else have += static_cast<size_t>(n);
      continue;
    }
    const size_t used = static_cast<size_t>(nl + 1 - buf);
    if (!skipping) {
      *nl = '\0';
      char* p = parse_range(buf, nl, &lo, &hi);
      if (p != nullptr && a >= lo && a < hi) {
        for (int field = 0; field < 4 && p != nullptr; ++field) {  // permissions, offset, device, inode
          while (*p == ' ') ++p;
          p = strchr(p, ' ');
        }
        while (p != nullptr && *p == ' ') ++p;
        const size_t len = p != nullptr ? strlen(p) : 0;
        constexpr char kDeleted[] = " (deleted)";
        const bool deleted = len >= sizeof kDeleted - 1 && strcmp(p + len - (sizeof kDeleted - 1), kDeleted) == 0;
        if (len > 0 && len < PATH_MAX && p[0] == '/' && !deleted) {
          memcpy(out, p, len + 1);
          found = true;
        }
        break;
      }
    }
    skipping = false;
    memmove(buf, nl + 1, have - used);
    have -= used;
  }
  close(fd);
  return found;
}

// The core, from beside this library as it was named, else from beside the file it names (a
// symlinked front; the kernel's path of our mapping, then realpath's), else by the loader's search
// (a front found by it).
void* open_core() {
  char first_path[PATH_MAX];
  const char* path = core_path(first_path);
  void* core = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (core != nullptr || path != first_path) {
    if (core == nullptr) warn_once(path, dlerror());
    return core;
  }
  char first_error[PATH_MAX + 256];
  snprintf(first_error, sizeof first_error, "%s", dlerror());
  char resolved[PATH_MAX], beside[PATH_MAX];
  for (int how = 0; how < 2; ++how) {
    const bool found = how == 0 ? mapped_file_of(reinterpret_cast<void*>(&gpushim::front::own_file_name), resolved)
                                : realpath(g_self_path, resolved) != nullptr;
    const char* slash = found ? strrchr(resolved, '/') : nullptr;
    if (slash != nullptr && core_beside(beside, resolved, static_cast<size_t>(slash - resolved)) &&
        strcmp(beside, path) != 0 && (core = dlopen(beside, RTLD_NOW | RTLD_LOCAL)) != nullptr)
      return core;
  }
  warn_once(path, first_error);
  return nullptr;
}

void wait_for_loads() {
  // Bounded: a fork from a library constructor (under the loader's lock) while another thread
  // waits for that lock to load the core must not wait forever.
  for (int i = 0; i < 40000 && __atomic_load_n(&g_loads_in_flight, __ATOMIC_ACQUIRE) != 0; ++i) {
    const timespec pause{0, 50 * 1000};
    nanosleep(&pause, nullptr);
  }
}

void at_load() {
  setup();
  pthread_atfork(
      [] {
        // The core's handlers first (its initialization lock: a thread holding it may be about to
        // dlopen, and must get through), then every load in flight. Should a core attach during
        // that wait (its first load), new loads are let through again while its handlers lock,
        // and the wait starts over; the core registers its handlers once, so this ends.
        int prepared = 0;
        for (;;) {
          const int n = __atomic_load_n(&g_fork_handler_count, __ATOMIC_ACQUIRE);
          run_core_prepare(prepared, n);
          prepared = n;
          __atomic_store_n(&g_forking, 1, __ATOMIC_SEQ_CST);
          wait_for_loads();
          if (__atomic_load_n(&g_fork_handler_count, __ATOMIC_ACQUIRE) == prepared) break;
          __atomic_store_n(&g_forking, 0, __ATOMIC_SEQ_CST);
        }
        g_prepared_handlers = prepared;
      },
      [] {
        run_core_after(false);
        __atomic_store_n(&g_forking, 0, __ATOMIC_RELEASE);
      },
      [] {
        run_core_after(true);
        // A load the prepare handler stopped waiting for (its bound) has no thread in the child to
        // end it: left counted, every later fork of the child would wait the full bound.
        __atomic_store_n(&g_loads_in_flight, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&g_forking, 0, __ATOMIC_RELEASE);
      });
}


}  // namespace

extern "C" {
// The front's one initializer, named to the linker with -init (DT_INIT) instead of constructors,
// which would be relocated .init_array entries (interpose/CMakeLists.txt: the front links without
// the start files). The fork handlers first, then the environment, in the constructors' order.
__attribute__((visibility("hidden"))) void gpushim_front_init() {
  at_load();
  gpushim::front::route_torch_allocator();
}

// pthread_atfork (libc_nonshared.a) registers handlers under the caller's __dso_handle, which the
// start files define; only its address is used, to drop them when the library is unloaded, and
// the front never is (-z nodelete). In .data: the one variable stored in the file puts the page
// after RELRO in the file, and the front's zero-initialized variables on it; without it the
// loader maps a page of zeros for them, one more mmap in every preloaded process.
__attribute__((visibility("hidden"), section(".data"))) void* __dso_handle = nullptr;

// The trampolines' targets (front_trampolines.cpp), null until the core is loaded.
__attribute__((visibility("hidden"))) void* gpushim_front_slots[GPUSHIM_FRONT_SYMBOLS];

// The first call of a trampoline whose slot is empty: the target to jump to, all arguments intact.
__attribute__((visibility("hidden"))) void* gpushim_front_resolve(unsigned index) {
  const char* name = name_at(index);
  // The public API answers "not active" until the first CUDA call loaded the core: a program
  // marking iterations on a machine without a GPU loads nothing.
  if (is_public_api(name) && __atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE) == kNotYet) return inactive_answer(name);
  gpushim::front::load_core();
  if (void* f = __atomic_load_n(&gpushim_front_slots[index], __ATOMIC_ACQUIRE)) return f;
  // No core, and CUDA had no such function when it failed: it may have one now (a runtime loaded
  // since), so ask again rather than answer 999 for good.
  void* f = next_symbol(name, nullptr);
  (void)dlerror();  // a lookup that found nothing is ours, not the program's
  if (f != nullptr) {
    __atomic_store_n(&gpushim_front_slots[index], f, __ATOMIC_RELEASE);
    return f;
  }
  return reinterpret_cast<void*>(&unavailable);
}
}

namespace gpushim::front {

void* real_dlsym_function() {
  DlsymFn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    fn = find_real_dlsym();
    __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<void*>(fn);
}

void* real_dlsym(void* handle, const char* name) {
  return reinterpret_cast<DlsymFn>(real_dlsym_function())(handle, name);
}

// dl_iterate_phdr rather than dladdr, which also goes through every one of the front's ~90
// symbols for the nearest: 5,000 instructions in each preloaded process's start-up, where this
// is called twice.
const char* own_file_name() {
  const char* name = nullptr;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const ElfW(Addr) self = reinterpret_cast<ElfW(Addr)>(&own_file_name);
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type == PT_LOAD && self - info->dlpi_addr - segment.p_vaddr < segment.p_memsz) {
            *static_cast<const char**>(out) = info->dlpi_name;
            return 1;
          }
        }
        return 0;
      },
      &name);
  return name;
}

bool is_own_address(const void* p) {
  Dl_info mine, theirs;
  return dladdr(reinterpret_cast<void*>(&own_file_name), &mine) != 0 && dladdr(p, &theirs) != 0 &&
         mine.dli_fbase == theirs.dli_fbase;
}

bool is_exported_function(const char* name) {
  for (const char* n = kNames; *n != '\0'; n += strlen(n) + 1)
    if (strcmp(n, name) == 0) return true;
  return false;
}

GpushimCoreSubstitute load_core() {
  if (__atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE) != kNotYet) return __atomic_load_n(&g_substitute, __ATOMIC_ACQUIRE);
  begin_load();
  setup();
  void* core = open_core();
  if (core != nullptr) {
    auto attach = reinterpret_cast<GpushimCoreAttach>(real_dlsym(core, kGpushimCoreAttach));
    if (attach == nullptr || attach(&g_table) != 0) {
      char where[PATH_MAX];
      warn_once(core_path(where), "not a gpushim core of this version");
      core = nullptr;
    }
  }
  const char* name = kNames;
  for (unsigned i = 0; i < kNameCount; ++i, name += strlen(name) + 1) {
    void* f = core != nullptr ? real_dlsym(core, name) : nullptr;
    if (f == nullptr) f = is_public_api(name) ? inactive_answer(name) : next_symbol(name, nullptr);
    // Left empty when CUDA has no such function yet: gpushim_front_resolve asks again.
    if (f != nullptr) __atomic_store_n(&gpushim_front_slots[i], f, __ATOMIC_RELEASE);
  }
  GpushimCoreSubstitute sub =
      core != nullptr ? reinterpret_cast<GpushimCoreSubstitute>(real_dlsym(core, kGpushimCoreSubstitute)) : nullptr;
  __atomic_store_n(&g_substitute, sub, __ATOMIC_RELEASE);
  __atomic_store_n(&g_loaded, core != nullptr ? kCore : kNoCore, __ATOMIC_RELEASE);
  end_load();
  // The lookups above that found nothing (a front without its core, CUDA functions this CUDA
  // lacks) must not leave an error for the program's next dlerror().
  (void)dlerror();
  return sub;
}

}  // namespace gpushim::front
