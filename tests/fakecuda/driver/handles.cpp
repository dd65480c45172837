// Handle minting, tombstones and misuse reports (see handles.h).
#include "handles.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "driver.h"

namespace fakecuda {
namespace {

// [kTag << 44 | kind << 40 | sequence << 4]: user-space addresses the kernel leaves unmapped in
// practice (heap near 0x55..., mappings near 0x7f...), 16-byte spaced, 2^36 handles per kind.
constexpr std::uintptr_t kTag = 0x6;
constexpr int kTagShift = 44, kKindShift = 40, kSeqShift = 4;
constexpr std::uintptr_t kSeqMask = (std::uintptr_t{1} << (kKindShift - kSeqShift)) - 1;

bool Minted(std::uintptr_t h) { return (h >> kTagShift) == kTag && (h & 0xf) == 0; }
HandleKind KindOf(std::uintptr_t h) { return static_cast<HandleKind>((h >> kKindShift) & 0xf); }

// The API that enqueued the host function this thread is running, or nullptr.
thread_local const char* t_host_function = nullptr;

}  // namespace

std::atomic<int> g_host_functions_running{0};

HostFunctionScope::HostFunctionScope(const char* api) : outer_(t_host_function) {
  t_host_function = api;
  g_host_functions_running.fetch_add(1, std::memory_order_relaxed);
}
HostFunctionScope::~HostFunctionScope() {
  g_host_functions_running.fetch_sub(1, std::memory_order_relaxed);
  t_host_function = outer_;
}

void RefuseCallFromHostFunctionSlow() {
  // A thread inside a scope sees its own increment, so the inline check let it through.
  if (t_host_function == nullptr) return;
  Misuse("a CUDA driver call from inside a host function enqueued with %s: CUDA says it \"must not make any CUDA "
         "API calls\" (undefined: it may deadlock on its own stream)",
         t_host_function);
}

const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kStream: return "stream";
    case HandleKind::kEvent: return "event";
    case HandleKind::kGraph: return "graph";
    case HandleKind::kGraphExec: return "graph exec";
    case HandleKind::kMemPool: return "memory pool";
    case HandleKind::kContext: return "context";
    case HandleKind::kPhysical: return "physical memory handle";
    case HandleKind::kArray: return "CUDA array";
    case HandleKind::kMipmappedArray: return "mipmapped array";
  }
  return "handle";
}

std::uintptr_t MintHandle(State& s, HandleKind kind) {
  const std::uintptr_t seq = ++s.handle_sequence & kSeqMask;
  return (kTag << kTagShift) | (static_cast<std::uintptr_t>(kind) << kKindShift) | (seq << kSeqShift);
}

void BuryHandle(State& s, HandleKind kind, std::uintptr_t handle, const char* call) {
  s.tombstones[handle] = State::Tombstone{kind, call};
}

void ReviveHandle(State& s, HandleKind kind, std::uintptr_t handle) {
  auto it = s.tombstones.find(handle);
  if (it != s.tombstones.end() && it->second.kind == kind) s.tombstones.erase(it);
}

void Misuse(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VStopForMisuse(fmt, ap);
}

void BadHandle(const State& s, const char* call, HandleKind kind, std::uintptr_t handle) {
  const char* what = HandleKindName(kind);
  auto it = s.tombstones.find(handle);
  if (it != s.tombstones.end() && it->second.kind == kind) {
    Misuse("%s: %s %#lx was destroyed (%s)", call, what, static_cast<unsigned long>(handle), it->second.destroyed_by);
  }
  if (it != s.tombstones.end()) {
    Misuse("%s: %#lx is no %s: it is a handle of another kind (%s), destroyed (%s)", call,
           static_cast<unsigned long>(handle), what, HandleKindName(it->second.kind), it->second.destroyed_by);
  }
  if (Minted(handle) && KindOf(handle) != kind) {
    Misuse("%s: %#lx is no %s: it is a handle of another kind (%s)", call, static_cast<unsigned long>(handle), what,
           HandleKindName(KindOf(handle)));
  }
  Misuse("%s: %s %#lx was never created", call, what, static_cast<unsigned long>(handle));
}

}  // namespace fakecuda
