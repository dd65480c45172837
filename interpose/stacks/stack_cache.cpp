#include "stacks/stack_cache.h"

#include <link.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "python/python_code_table.h"
#include "util/dlopen_guard.h"

namespace gpushim {
namespace {

// The calling thread's cache. A plain pointer (static TLS, no constructor) so that threads that
// never capture a stack pay nothing; the reaper frees it when a thread that did exits.
thread_local ThreadStackCache* t_cache = nullptr;
std::atomic<size_t> g_bytes{0};  // every thread's cache: the objects and their entries' checks
thread_local bool t_exited = false;

struct Reaper {
  bool armed = false;
  ~Reaper() {
    t_exited = true;
    delete t_cache;
    t_cache = nullptr;
  }
};
thread_local Reaper t_reaper;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

// Stack words of the thread are read where an earlier unwind found them: under AddressSanitizer
// such a word can lie in a redzone of the frame that sits there now, which is not an error here.
__attribute__((no_sanitize("address"))) bool words_hold(const StackWordCheck* c, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    if (*reinterpret_cast<const uint64_t*>(c[i].addr) != c[i].value) return false;
  return true;
}

}  // namespace

ThreadStackCache* ThreadStackCache::acquire() {
  ThreadStackCache* c = t_cache;
  if (__builtin_expect(c == nullptr, 0)) {
    if (t_exited) return nullptr;
    c = new (std::nothrow) ThreadStackCache();
    if (c == nullptr) return nullptr;
    t_reaper.armed = true;  // first use registers the thread-exit destructor
    t_cache = c;
    g_bytes.fetch_add(sizeof(ThreadStackCache), std::memory_order_relaxed);
  }
  if (c->busy_) return nullptr;
  c->busy_ = true;
  const uint64_t gen = loaded_objects_generation();
  if (gen != c->generation_) {
    c->clear();
    c->generation_ = gen;
  }
  return c;
}

ThreadStackCache::~ThreadStackCache() {
  clear();
  g_bytes.fetch_sub(sizeof(ThreadStackCache), std::memory_order_relaxed);
}

size_t ThreadStackCache::total_bytes() { return g_bytes.load(std::memory_order_relaxed); }

void ThreadStackCache::clear() {
  for (Set& s : sets_) {
    for (Entry& e : s.ways) {
      std::free(e.checks);
      e = Entry{};
    }
    s = Set{};
  }
  g_bytes.fetch_sub(bytes_, std::memory_order_relaxed);
  bytes_ = 0;
}

uint64_t ThreadStackCache::loaded_objects_generation() {
  unsigned long long counters[2] = {0, 0};
  const LoaderScope loader_work;  // a fork waits for it (util/dlopen_guard.h)
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) {
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
          auto* c = static_cast<unsigned long long*>(data);
          c[0] = info->dlpi_adds;
          c[1] = info->dlpi_subs;
        }
        return 1;  // the counters are the same in every entry: the first one is enough
      },
      counters);
  return (static_cast<uint64_t>(counters[0]) << 32) ^ counters[1];
}

uint64_t ThreadStackCache::key_of(const Probe& p) {
  uint64_t h = mix(p.owner, p.frame_address);
  h = mix(h, p.n_python);
  // The innermost Python frames: sites that differ in a line near the top get different sets (the
  // rest is left to the check, so that the key stays a few multiplies).
  for (size_t i = 0; i < p.n_python && i < 4; ++i)
    h = mix(h, p.python[i].code ^ (static_cast<uint64_t>(static_cast<uint32_t>(p.python[i].byte_offset)) << 44));
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty way
}

bool ThreadStackCache::matches(const Entry& e, const Probe& p, uint64_t key) const {
  if (e.key != key || e.owner != p.owner || e.frame_address != p.frame_address || e.n_python != p.n_python) return false;
  const auto* py = reinterpret_cast<const PyCheck*>(e.checks + e.n_checks);
  for (uint32_t i = 0; i < e.n_python; ++i) {
    const PyFrameRef& f = p.python[i];
    if (py[i].frame != f.frame || py[i].code != f.code || py[i].offset != f.byte_offset ||
        py[i].ends_eval_call != f.ends_eval_call)
      return false;
  }
  if (!words_hold(e.checks, e.n_checks)) return false;
  // The code objects run by the frames now: alive, so their fields can be read.
  for (uint32_t i = 0; i < e.n_python; ++i) {
    if (!(python_code_identity(*p.layout, py[i].code) == py[i].identity)) return false;
  }
  return true;
}

bool ThreadStackCache::find(const Probe& p, StackId* id) {
  const uint64_t key = key_of(p);
  Set& s = sets_[key % kSets];
  for (Entry& e : s.ways) {
    if (matches(e, p, key)) {
      e.last_use = ++clock_;
      *id = e.id;
      ++hits_;
      return true;
    }
  }
  ++misses_;
  return false;
}

bool ThreadStackCache::seen_twice(const Probe& p, StackId id) {
  const uint64_t key = key_of(p);
  Set& s = sets_[key % kSets];
  for (size_t i = 0; i < 4; ++i)
    if (s.refused_key[i] == key && s.refused_id[i] == id) return false;
  for (size_t i = 0; i < kWays; ++i)
    if (s.pending_key[i] == key && s.pending_id[i] == id) {
      // A trace costs microseconds: once past the first ones, each must have paid for itself
      // (stacks whose checked words change on every call would otherwise be traced every time).
      if (traces_ >= 64 && traces_ * 8 > hits_) return false;
      s.pending_key[i] = 0;
      ++traces_;
      return true;
    }
  s.pending_key[s.pending_next] = key;
  s.pending_id[s.pending_next] = id;
  s.pending_next = (s.pending_next + 1) % kWays;
  return false;
}

bool ThreadStackCache::insert(const Probe& p, const NativeFrameTrace* t, size_t nt, const uint64_t* native, size_t got,
                              size_t want, StackId id) {
  if (build(p, t, nt, native, got, want, id)) return true;
  Set& s = sets_[key_of(p) % kSets];
  s.refused_key[s.refused_next] = key_of(p);
  s.refused_id[s.refused_next] = id;
  s.refused_next = (s.refused_next + 1) % 4;
  return false;
}

// no_sanitize: reads words of live caller frames that an instrumented caller may mark as redzones.
__attribute__((no_sanitize("address"))) bool ThreadStackCache::build(const Probe& p, const NativeFrameTrace* t, size_t nt, const uint64_t* native, size_t got,
                             size_t want, StackId id) {
  // The frame that called the capturing function: its stack pointer is the capturing function's
  // CFA, two words above its frame address (push rbp; mov rsp, rbp).
  const uint64_t caller_sp = p.frame_address + 16;
  size_t c = 0;
  while (c < nt && t[c].sp != caller_sp) ++c;
  if (c == nt || got == 0) return false;
  // Where the unwinder's answer reaches that frame: its first words are the capturing function's
  // own (return addresses inside it, the same on every call from the same code).
  size_t j0 = 0;
  while (j0 < got && j0 < 4 && native[j0] != t[c].ip) ++j0;
  if (j0 == got || j0 == 4) return false;
  const size_t m = got - j0;
  if (c + m > nt || m > kMaxNativeTraceFrames) return false;
  for (size_t i = 0; i < m; ++i)
    if (t[c + i].ip != native[j0 + i]) return false;
  const bool ended = got < want;
  if (ended && c + m != nt) return false;  // the two unwinds disagree on where the stack ends

  StackWordCheck* const checks = scratch_;
  size_t n = 0;
  const uint64_t lowest = p.frame_address, highest = t[c + m - 1].sp + (1u << 20);
  auto add = [&](uint64_t addr, uint64_t value) {
    if (addr < lowest || addr >= highest || (addr & 7) != 0) return false;
    checks[n++] = StackWordCheck{addr, value};
    return true;
  };
  for (size_t k = c; k < c + m; ++k) {
    const NativeFrameTrace& f = t[k];
    if (f.signal_frame || f.ip_slot == 0 || !add(f.ip_slot, f.ip)) return false;
    const bool last = k + 1 == c + m;
    bool rbp_used;
    if (!last) {
      // Any frame whose CFA rule uses the frame pointer has it inside its own frame; such a
      // frame's rbp is checked (needlessly when the rule is rsp-based and rbp merely points there).
      const uint64_t cfa = t[k + 1].sp;
      rbp_used = f.rbp >= f.sp && f.rbp < cfa;
      if (rbp_used && cfa != f.rbp + 16) {
        // Not the standard frame pointer: libffi's CFA = rbp + 32, or GCC's stack realignment,
        // whose CFA the unwinder reads from the word its prologue saved just under rbp. Such a
        // word holds the CFA itself; it is checked too.
        for (uint64_t off = 8; off <= 16; off += 8) {
          const uint64_t a = f.rbp - off;
          if (a >= f.sp && *reinterpret_cast<const uint64_t*>(a) == cfa && !add(a, cfa)) return false;
        }
      }
    } else {
      if (!ended) break;  // the unwind stopped at the requested depth: nothing past it was read
      if (f.step_failed) return false;
      // Where the stack ends the unwinder may have tried the frame-pointer chain: those words too.
      rbp_used = true;
      if (f.rbp != 0) {
        if (f.rbp < lowest || f.rbp + 16 > highest || (f.rbp & 7) != 0) return false;  // not a stack word: never read
        const auto* w = reinterpret_cast<const uint64_t*>(f.rbp);
        add(f.rbp, w[0]);
        add(f.rbp + 8, w[1]);
      }
    }
    if (rbp_used && (f.rbp_slot == 0 || !add(f.rbp_slot, f.rbp))) return false;
  }

  const uint64_t key = key_of(p);
  Set& s = sets_[key % kSets];
  Entry* victim = &s.ways[0];
  for (Entry& e : s.ways) {
    if (e.key == 0) {
      victim = &e;
      break;
    }
    if (e.last_use < victim->last_use) victim = &e;
  }
  const size_t bytes = n * sizeof(StackWordCheck) + p.n_python * sizeof(PyCheck);
  if (bytes_ - victim->bytes + bytes > kMaxBytes) return false;  // full: what is cached stays
  void* block = std::malloc(bytes);
  if (block == nullptr) return false;
  std::free(victim->checks);
  bytes_ = bytes_ - victim->bytes + bytes;
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
  g_bytes.fetch_sub(victim->bytes, std::memory_order_relaxed);
  Entry& e = *victim;
  e.bytes = static_cast<uint32_t>(bytes);
  e.key = key;
  e.owner = p.owner;
  e.frame_address = p.frame_address;
  e.n_checks = static_cast<uint32_t>(n);
  e.n_python = static_cast<uint32_t>(p.n_python);
  e.checks = static_cast<StackWordCheck*>(block);
  std::memcpy(e.checks, checks, n * sizeof(StackWordCheck));
  auto* py = reinterpret_cast<PyCheck*>(e.checks + n);
  for (size_t i = 0; i < p.n_python; ++i) {
    const PyFrameRef& f = p.python[i];
    py[i] = PyCheck{f.frame, f.code, f.byte_offset, f.ends_eval_call, python_code_identity(*p.layout, f.code)};
  }
  e.id = id;
  e.last_use = ++clock_;
  return true;
}

size_t ThreadStackCache::entries() const {
  size_t n = 0;
  for (const Set& s : sets_)
    for (const Entry& e : s.ways) n += e.key != 0;
  return n;
}

}  // namespace gpushim
