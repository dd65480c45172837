// Handle validity: the values handed to the program for streams, events, graphs, graph execs and
// memory pools, and the rule that any use of a destroyed or never-created handle stops the process.
//
// NVIDIA's driver dereferences a handle without checking it: a destroyed stream or event is freed
// memory, and using it segfaults (or worse, silently hits whatever was allocated there since). The
// simulated device must be at least as strict, so that no test passes through such a call: it
// reports the misuse in one line on stderr, like a sanitizer, and ends the process at once with
// kMisuseExitStatus (no atexit handler runs). FAKECUDA_MISUSE_ABORT=1 makes it abort() instead,
// for a core file or a debugger's backtrace.
//
// Handles are minted from one counter and never recycled, so a handle destroyed long ago can never
// alias a live object created since. The value encodes its kind (a stream handle passed as an event
// is told apart from a handle that never existed) and lies in an unmapped, non-pointer range
// (0x6k00'0000'0000 ... ), so a stray dereference faults too. Destroyed handles keep a tombstone
// naming the call that destroyed them, for the report. Contexts are the exception: their handles
// are the addresses of Context objects, which are never freed (see user_contexts.cpp), so their
// addresses are never reused either; destroyed ones get a tombstone all the same.
//
// Every function here expects State::mu to be held, except Misuse.
#pragma once

#include <atomic>
#include <cstdint>

#include "../misuse.h"

namespace fakecuda {

struct State;


enum class HandleKind : std::uint8_t {
  kStream = 1,
  kEvent,
  kGraph,
  kGraphExec,
  kMemPool,
  kContext,
  kPhysical,  // cuMemCreate / cuMemImportFromShareableHandle / cuMemRetainAllocationHandle
  kArray,     // cuArrayCreate / cuArray3DCreate
  kMipmappedArray,
};

const char* HandleKindName(HandleKind kind);

// A fresh handle value of `kind`: different from every handle minted before or after, from 0,
// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
std::uintptr_t MintHandle(State& s, HandleKind kind);

// `handle` of `kind` was destroyed by `call` (an API name, a string literal): later uses are misuse.
void BuryHandle(State& s, HandleKind kind, std::uintptr_t handle, const char* call);
// A physical-memory handle comes back to life (cuMemRetainAllocationHandle returns the same value).
void ReviveHandle(State& s, HandleKind kind, std::uintptr_t handle);

// `call` was given `handle` as a `kind`, and no live one has that value: reports why (destroyed by
// which call, another kind's handle, or never created) and stops the process.
[[noreturn]] void BadHandle(const State& s, const char* call, HandleKind kind, std::uintptr_t handle);

// A program's host function (cuLaunchHostFunc, a graph host node) or stream callback
// (cuStreamAddCallback) runs on a stream worker inside this scope. CUDA says such a function "must
// not make any CUDA API calls" (it may get CUDA_ERROR_NOT_PERMITTED, "but this is not required":
// a call that waits for its own stream deadlocks on a GPU), so a driver call made inside the scope
// is misuse (CheckInitialized). `api` names the call that enqueued the function.
class HostFunctionScope {
 public:
  explicit HostFunctionScope(const char* api);
  ~HostFunctionScope();
  HostFunctionScope(const HostFunctionScope&) = delete;
  HostFunctionScope& operator=(const HostFunctionScope&) = delete;

 private:
  const char* outer_;
};
// Host functions running on any thread (HostFunctionScope): every driver call checks this first,
// inline, so that a call made outside one (nearly all) reads no thread-local variable, whose lookup
// in this library (__tls_get_addr) cost a pooled 4 KiB pair of the shim 27 instructions.
extern std::atomic<int> g_host_functions_running;
void RefuseCallFromHostFunctionSlow();
// Stops the process if the calling thread is running a host function (HostFunctionScope).
inline void RefuseCallFromHostFunction() {
  if (g_host_functions_running.load(std::memory_order_relaxed) != 0) RefuseCallFromHostFunctionSlow();
}

// Reports "fakecuda: misuse: <message>" on one line and stops the process.
[[noreturn]] void Misuse(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace fakecuda
