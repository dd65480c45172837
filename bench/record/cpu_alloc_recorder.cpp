// LD_PRELOAD recorder of PyTorch's CPU tensor allocations, for the trace corpus (bench/traces).
//
// PyTorch's CPU allocator (c10::alloc_cpu in libc10.so, torch 1.13) gets every tensor's storage
// with one posix_memalign(64, nbytes) and releases it with free() (c10::free_cpu tail-calls it).
// This library wraps both: a posix_memalign whose caller is inside libc10 is a tensor storage (the
// only posix_memalign call in libc10 is alloc_cpu's); everything else in the process (Python's
// allocator, oneDNN's scratchpads, BLAS buffers, libtorch_cpu's own aligned buffers) is left out.
// free() cannot be filtered by caller (the tail call hides it), so the recorder keeps the set of
// live tensor pointers and logs only frees of those.
//
// Output: GPUSHIM_REC_OUT names a file of fixed 32-byte records (RawRecord below), converted to
// the trace format by gpushim_cpu_trace_convert. `gpushim_rec_mark()` (ctypes) logs a step mark.
// No STL and no allocation here: this runs inside malloc's callers.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu_raw_record.h"

namespace {

using PosixMemalignFn = int (*)(void**, size_t, size_t);
using FreeFn = void (*)(void*);

PosixMemalignFn g_real_memalign = nullptr;
FreeFn g_real_free = nullptr;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
int g_fd = -1;
bool g_enabled = false;
uintptr_t g_c10_begin = 0, g_c10_end = 0;  // libc10's mapped range once it is loaded

constexpr size_t kBufferRecords = 1 << 14;
gpushim_bench::RawRecord g_buffer[kBufferRecords];
size_t g_buffered = 0;

// Live tensor pointers: open addressing with linear probing and backward-shift deletion, in memory
// from mmap so that the recorder never calls the allocator it watches.
constexpr size_t kTableSlots = 1 << 21;
uintptr_t* g_table = nullptr;

size_t slot_of(uintptr_t p) { return static_cast<size_t>((p >> 6) * 0x9E3779B97F4A7C15ull >> 43) & (kTableSlots - 1); }

bool table_insert(uintptr_t p) {
  for (size_t i = slot_of(p), n = 0; n < kTableSlots; i = (i + 1) & (kTableSlots - 1), ++n) {
    if (g_table[i] == 0 || g_table[i] == p) {
      g_table[i] = p;
      return true;
    }
  }
  return false;
}

bool table_erase(uintptr_t p) {
  size_t i = slot_of(p);
  for (size_t n = 0;; i = (i + 1) & (kTableSlots - 1), ++n) {
    if (n == kTableSlots || g_table[i] == 0) return false;
    if (g_table[i] == p) break;
  }
  // Backward shift: move later entries of the probe run into the hole when that keeps them
  // reachable from their home slot.
  size_t hole = i;
  for (size_t j = (i + 1) & (kTableSlots - 1); g_table[j] != 0; j = (j + 1) & (kTableSlots - 1)) {
    const size_t home = slot_of(g_table[j]);
    const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      g_table[hole] = g_table[j];
      hole = j;
    }
  }
  g_table[hole] = 0;
  return true;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void flush_locked() {
  const char* p = reinterpret_cast<const char*>(g_buffer);
  size_t left = g_buffered * sizeof(g_buffer[0]);
  while (left > 0 && g_fd >= 0) {
    const ssize_t w = write(g_fd, p, left);
    if (w <= 0) break;
    p += w;
    left -= static_cast<size_t>(w);
  }
  g_buffered = 0;
}

void append_locked(uint32_t kind, uintptr_t ptr, uint64_t size) {
  gpushim_bench::RawRecord& r = g_buffer[g_buffered++];
  r.t_ns = now_ns();
  r.ptr = ptr;
  r.size = size;
  r.kind = kind;
  r.reserved = 0;
  if (g_buffered == kBufferRecords) flush_locked();
}

int find_c10(dl_phdr_info* info, size_t, void*) {
  const char* name = info->dlpi_name;
  if (name == nullptr || std::strstr(name, "/libc10.so") == nullptr) return 0;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t b = info->dlpi_addr + ph.p_vaddr;
    if (b < lo) lo = b;
    if (b + ph.p_memsz > hi) hi = b + ph.p_memsz;
  }
  g_c10_begin = lo;
  g_c10_end = hi;
  return 1;
}

bool from_c10(uintptr_t caller) {
  if (g_c10_end == 0) dl_iterate_phdr(find_c10, nullptr);  // cheap until torch is imported
  return caller >= g_c10_begin && caller < g_c10_end;
}

__attribute__((constructor)) void recorder_init() {
  g_real_memalign = reinterpret_cast<PosixMemalignFn>(dlsym(RTLD_NEXT, "posix_memalign"));
  g_real_free = reinterpret_cast<FreeFn>(dlsym(RTLD_NEXT, "free"));
  const char* out = getenv("GPUSHIM_REC_OUT");
  if (out == nullptr || *out == '\0') return;
  void* table = mmap(nullptr, kTableSlots * sizeof(uintptr_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (table == MAP_FAILED) return;
  g_table = static_cast<uintptr_t*>(table);
  g_fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  g_enabled = g_fd >= 0;
}

__attribute__((destructor)) void recorder_fini() {
  pthread_mutex_lock(&g_lock);
  if (g_enabled) {
    flush_locked();
    close(g_fd);
    g_fd = -1;
    g_enabled = false;
  }
  pthread_mutex_unlock(&g_lock);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int posix_memalign(void** out, size_t alignment, size_t size) {
  if (g_real_memalign == nullptr) g_real_memalign = reinterpret_cast<PosixMemalignFn>(dlsym(RTLD_NEXT, "posix_memalign"));
  const int r = g_real_memalign(out, alignment, size);
  if (r != 0 || !g_enabled) return r;
  const uintptr_t caller = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  pthread_mutex_lock(&g_lock);
  if (g_enabled && from_c10(caller) && table_insert(reinterpret_cast<uintptr_t>(*out)))
    append_locked(gpushim_bench::kRawAlloc, reinterpret_cast<uintptr_t>(*out), size);
  pthread_mutex_unlock(&g_lock);
  return r;
}

__attribute__((visibility("default"))) void free(void* p) {
  if (p != nullptr && g_enabled) {
    // Logged before the memory goes back: the next allocation at this address comes after it.
    pthread_mutex_lock(&g_lock);
    if (g_enabled && table_erase(reinterpret_cast<uintptr_t>(p))) append_locked(gpushim_bench::kRawFree, reinterpret_cast<uintptr_t>(p), 0);
    pthread_mutex_unlock(&g_lock);
  }
  if (g_real_free == nullptr) g_real_free = reinterpret_cast<FreeFn>(dlsym(RTLD_NEXT, "free"));
  g_real_free(p);
}

// A training or serving step begins (the models script calls it through ctypes).
__attribute__((visibility("default"))) void gpushim_rec_mark() {
  pthread_mutex_lock(&g_lock);
  if (g_enabled) append_locked(gpushim_bench::kRawMark, 0, 0);
  pthread_mutex_unlock(&g_lock);
}

}  // extern "C"
