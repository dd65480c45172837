// Internal interface shared by the source files of the fake libcuda.so.1.
//
// Model: every simulated device owns a sparse memfd of `capacity` bytes mapped at a fixed address
// range (the "arena"); device pointers are host addresses inside it, so tests can dereference them.
// One mutex (State::mu) guards all driver bookkeeping; stream work runs on one worker thread per
// stream *outside* that mutex. The fake favours obviously-correct locking over speed.
//
// Conventions:
//   * Functions taking `State&` expect State::mu to be held by the caller, unless they also take the
//     `std::unique_lock` (those may release it temporarily while waiting).
//   * Exported entry points are defined under their real exported names (cuMemAlloc_v2, ...); cuda.h is
//     included with __CUDA_API_VERSION_INTERNAL so it declares every variant without renaming macros,
//     which also makes the compiler check our definitions against NVIDIA's prototypes.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "config.h"
#include "handles.h"

namespace fakecuda {

inline constexpr int kDriverVersion = 13000;
// cudaMalloc guarantees at least 256-byte alignment; real allocations are 512-byte aligned or better.
inline constexpr std::size_t kAllocAlignment = 512;
// VMM granularity (cuMemGetAllocationGranularity, minimum and recommended), as on current GPUs.
inline constexpr std::size_t kGranularity = std::size_t{2} << 20;

inline constexpr std::size_t RoundUp(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// Work done "by the device" (copies, memsets, fills) races with host threads by design, exactly
// as DMA would: a test may deliberately let a late fill land in reused memory. ThreadSanitizer
// builds therefore do not track the memory accesses of such work.
#if defined(__SANITIZE_THREAD__)
#define FAKECUDA_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FAKECUDA_TSAN 1
#endif
#endif
#ifdef FAKECUDA_TSAN
// The dynamic-annotations entry points: GCC's shared libtsan and clang's static TSan runtime both
// export them to libraries (clang's runtime does not export __tsan_ignore_thread_begin, so a
// library calling that one fails to load into a clang TSan program).
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

template <typename F>
auto DeviceWork(F&& fn) {
  return [fn = std::forward<F>(fn)]() {
#ifdef FAKECUDA_TSAN
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
    fn();
#ifdef FAKECUDA_TSAN
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  };
}

// Faults in the pages of [p, p + n) that are not resident yet, in one call, before device work
// writes the whole range. The simulated device's memory is a memfd whose pages the first write
// faults in one by one: a test filling a few GiB spent most of its time in the kernel (a fill of
// fresh memory took 1.6 s for 512 MiB against 0.9 s populated first, on the development machine).
// Only for ranges the work is about to write in full, so memory a program never writes stays
// unbacked, as before. Best effort: a kernel without MADV_POPULATE_WRITE changes nothing.
void PopulateForWrite(std::uintptr_t p, std::size_t n);

struct Context;
struct Stream;
struct Event;
struct Capture;
struct Graph;
struct PhysicalAllocation;
struct MemPool;

// ------------------------------------------------------------------------------------------------
// Device memory (device_memory.cpp)
// ------------------------------------------------------------------------------------------------

// The backing store of one device: a sparse memfd of `capacity` bytes, mapped MAP_SHARED once at a
// 2 MiB aligned address. Ranges are carved first-fit, 512-byte aligned; freed ranges get their pages
// punched out of the memfd, so RAM goes back to the system, once more than a budget of bytes
// lie free within the span carved since the last time (Release says why). The memfd also backs legacy IPC: another
// process maps a range of it through /proc/<pid>/fd/<fd>.
class Arena {
 public:
  bool Init(int device, std::size_t capacity);
  bool ready() const { return base_ != 0; }
  std::uintptr_t base() const { return base_; }
  bool contains(std::uintptr_t p) const { return ready() && p - base_ < size_; }
  int fd() const { return fd_; }
  std::optional<std::size_t> Carve(std::size_t size);  // returns an offset
  void Release(std::size_t offset, std::size_t size);

 private:
  std::optional<std::size_t> Fit(std::size_t size);

  int fd_ = -1;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, coalesced
  std::size_t kept_budget_ = 0;  // free bytes left resident: a quarter of the capacity, at most 2 GiB
  std::size_t carved_ = 0;  // bytes carved now
  // The span carved since free ranges were last punched out: pages outside it hold nothing.
  std::size_t touched_begin_ = 0, touched_end_ = 0;
};

enum class RegionKind {
  kDeviceMalloc,  // cuMemAlloc / cuMemAllocPitch
  kDeviceAsync,   // cuMemAllocAsync / cuMemAllocFromPoolAsync outside capture
  kGraph,         // cuMemAllocAsync during stream capture (graph memory)
  kManaged,       // cuMemAllocManaged
  kPinnedHost,    // cuMemAllocHost / cuMemHostAlloc
  kVmmMapping,    // cuMemMap of a cuMemCreate allocation
  kIpcImport,     // cuIpcOpenMemHandle
  kArray,         // the storage of a CUDA array (cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate)
};

// One live allocation (or mapping) in the unified address space; key of State::regions is `base`.
struct Region {
  std::uintptr_t base = 0;
  std::size_t size = 0;        // requested size (what cuMemGetAddressRange reports)
  RegionKind kind = RegionKind::kDeviceMalloc;
  int device = -1;             // -1: host memory without a device
  Context* ctx = nullptr;      // owning context (nullptr for VMM mappings)
  std::uint64_t buffer_id = 0; // CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation
  // Arena-backed kinds: location in the device memfd and the bytes charged against capacity.
  std::size_t arena_offset = 0;
  std::size_t charged = 0;
  bool free_pending = false;   // freed: cuMemFreeAsync issued (stream_ordered_free), or a cuMemFree in progress
  bool stream_ordered_free = false;  // free_pending by cuMemFreeAsync: querying it is undefined now
  // Another graph's memory whose free a capture recorded: still the program's until that graph's
  // launch frees it (or for good, should the graph never launch).
  bool free_node_pending = false;
  bool graph_unlaunched = false;  // kGraph: no launch has allocated it yet (cannot be freed outside a graph)
  // kGraph: the graph whose launches make it. Freed while that graph exists, it keeps its address
  // for the graph's next launch ("The allocation's address remains fixed across instantiations and
  // launches", cuGraphAddMemAllocNode): unlaunched again (`graph_parked`), not given back.
  std::weak_ptr<Graph> graph;
  bool graph_parked = false;
  MemPool* pool = nullptr;
  // kDeviceAsync: where in stream order the allocation is. The fake allocates at once, but "the
  // allocation must not be accessed until the allocation operation completes" (cuMemAllocAsync):
  // work of another stream that runs before `alloc_stream` completed `alloc_seq` ops is unordered
  // with it (RequireAllocationsReached). Weak: a stream gone has completed everything.
  std::weak_ptr<Stream> alloc_stream;
  std::uint64_t alloc_seq = 0;
  std::uint64_t capture_id = 0;  // kGraph: the capture sequence that allocated it
  // kVmmMapping
  std::shared_ptr<PhysicalAllocation> phys;
  std::size_t phys_offset = 0;
  std::uintptr_t reservation_base = 0;
  std::size_t reservation_size = 0;
  // Access granted per location (type, id) by cuMemSetAccess; `access` is the strongest of them,
  // which is the protection the host-side mapping gets.
  std::map<std::pair<int, int>, CUmemAccess_flags> access_by_location;
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  // kIpcImport (and host kinds): the mmap()ed span to munmap() on release.
  std::uintptr_t map_base = 0;
  std::size_t map_length = 0;
  int import_refs = 0;
  // kPinnedHost made by cuMemHostRegister: the caller's own memory, never unmapped or freed here.
  bool host_registered = false;
  std::uint64_t import_pid = 0, import_buffer_id = 0;
};

// ------------------------------------------------------------------------------------------------
// Streams, events, capture (streams.cpp, events.cpp, capture.cpp)
// ------------------------------------------------------------------------------------------------

// "Wait until `stream` has completed its op number `seq`."
struct Dep {
  std::shared_ptr<Stream> stream;
  std::uint64_t seq = 0;
};

// Device memory an op reads or writes, where the fake knows it: copies and memsets (a kernel's
// arguments are opaque to it).
struct Touch {
  std::uintptr_t base = 0;
  std::size_t size = 0;
};

struct Op {
  std::function<void()> run;
  std::vector<Dep> deps;
  std::vector<Touch> touches;
  // A synchronous op the calling thread runs itself (SubmitAndWait on an idle stream): listed, so
  // that its touches are seen and later ops queue behind it, but never taken by the worker.
  bool on_caller = false;
};

enum class StreamKind { kLegacy, kPerThread, kUser };

struct Stream : std::enable_shared_from_this<Stream> {
  std::uint64_t id = 0;
  std::uintptr_t handle = 0;  // kUser: the program's CUstream (handles.h); 0 for default streams
  Context* ctx = nullptr;
  StreamKind kind = StreamKind::kUser;
  unsigned flags = 0;  // CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING
  int priority = 0;
  std::deque<Op> queue;       // pending ops; the front one is executing or waiting for its deps
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  bool worker_started = false;
  bool retired = false;       // destroyed by the user (or context reset): worker exits when drained
  std::condition_variable wake;
  std::condition_variable done;  // notified when `completed` moves: WaitForStream's waiters
  std::shared_ptr<Capture> capture;  // set while the stream takes part in a capture sequence

  // Blocking streams synchronize implicitly with the legacy default stream.
  bool blocking() const { return kind != StreamKind::kLegacy && (flags & CU_STREAM_NON_BLOCKING) == 0; }
  bool idle() const { return completed == submitted; }
};

struct Event {
  std::uintptr_t handle = 0;
  Context* ctx = nullptr;
  unsigned flags = 0;
  bool recorded = false;          // recorded at least once outside capture
  std::shared_ptr<Stream> stream; // stream of the last record
  std::uint64_t seq = 0;          // op number of the last record on that stream
  std::uint64_t generation = 0;   // bumped per record, so a stale record op does not timestamp
  bool timestamp_valid = false;
  std::chrono::steady_clock::time_point timestamp;
  std::shared_ptr<Capture> capture;  // last recorded inside this capture sequence
  std::map<const Stream*, std::uint64_t> capture_depends;  // the nodes a wait on it depends on (Capture::depends)
  // CU_EVENT_INTERPROCESS events (and events opened from their handles): completion lives in a
  // page shared between processes (ipc_events.cpp).
  std::shared_ptr<struct IpcEventPage> ipc;
};

// A dummy graph: what a capture recorded. Replayable data operations are kept so that a launched
// graph does the same memory writes; graph memory freed inside the graph is owned by it.
struct Graph {
  std::uintptr_t handle = 0;  // 0 until the program gets one (end of capture, cuGraphCreate)
  Context* ctx = nullptr;     // current when it was made; a reset of that context destroys it
  std::vector<std::function<void()>> nodes;
  std::vector<Touch> touches;  // device memory its captured copies and memsets access (a launch's)
  // Handles of its explicit nodes, in the order added. Kept here, not in a table keyed by the
  // Graph's address: a graph made after this one is destroyed may get the same address.
  std::vector<CUgraphNode> node_handles;
  // Graph memory its allocation nodes (or captured allocations) make: usable outside the graph,
  // and freeable there, only once a launch has run them.
  std::vector<std::uintptr_t> allocations;
  std::vector<std::uintptr_t> owned_allocations;
  // Allocations from outside the graph whose free was captured (freed when the graph launches):
  // (base, buffer id).
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> deferred_frees;
  bool user_handle_alive = true;
  int execs = 0;
};

struct GraphExec {
  std::uintptr_t handle = 0;
  Context* ctx = nullptr;
  std::shared_ptr<Graph> graph;
  unsigned long long flags = 0;  // CUDA_GRAPH_INSTANTIATE_FLAG_*
};

struct Capture {
  std::uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;  // thread that called BeginCapture
  Stream* origin = nullptr;
  bool invalidated = false;
  std::shared_ptr<Graph> graph;
  std::vector<std::shared_ptr<Stream>> streams;  // origin plus streams that joined via events
  // Fork and join: the nodes each stream recorded in this capture, and how many of each stream's
  // nodes a stream's next node depends on (through events recorded in the capture). At the end
  // the origin must depend on every node of every stream that joined (CUDA_ERROR_STREAM_CAPTURE_UNJOINED).
  std::map<const Stream*, std::uint64_t> nodes;
  std::map<const Stream*, std::map<const Stream*, std::uint64_t>> depends;
};
// A node recorded on `stream` in its capture (captured work, allocation or free).
void NoteCapturedNode(Capture& capture, const Stream* stream);

// ------------------------------------------------------------------------------------------------
// Contexts and devices (context.cpp)
// ------------------------------------------------------------------------------------------------

// A memory pool's figures, as CUDA reports them through cuMemPoolGetAttribute. Only the figures
// are modelled: the memory itself goes back to the arena when freed.
//
// "Used" is the bytes asked for, unrounded. "Reserved" is what the pool holds from the device, in
// whole chunks of kPoolChunk: measured on an H100 (driver 580, 2026-11-26), the default pool
// reserved 32 MiB for a first 1000-byte allocation, 64 MiB once 57 MiB were used, 160 MiB for
// 157 MiB, 128 MiB for one 120,953,344-byte allocation (the 134217728 PyTorch read on an H200) --
// always the used bytes rounded up to 32 MiB while the pool grows. The fake assumes no
// fragmentation beyond that: reserved = max(reserved, used rounded up to a chunk). What a freed
// allocation leaves reserved is kept up to the release threshold (CUDA gives the excess back at
// the next synchronization; the fake does at the free, which a program can only tell by reading
// the figures in between).
inline constexpr std::uint64_t kPoolChunk = std::uint64_t{32} << 20;

struct MemPool {
  std::uintptr_t handle = 0;  // a created pool's (handles.h); a default pool's handle is its address
  int device = 0;
  // cuMemPoolSetAccess: what other devices were given (bookkeeping; the pool's own device always
  // has read-write access). Accesses of pool memory are not checked per device.
  std::map<int, CUmemAccess_flags> access;
  bool is_default = false;
  std::uint64_t used = 0, used_high = 0;
  std::uint64_t reserved = 0, reserved_high = 0;
  std::uint64_t release_threshold = 0;  // CUDA's default: give everything back
  int reuse_follow_event_dependencies = 1, reuse_allow_opportunistic = 1, reuse_allow_internal_dependencies = 1;

  static std::uint64_t Chunks(std::uint64_t bytes) {
    if (bytes > UINT64_MAX - kPoolChunk) return UINT64_MAX;  // a "keep everything" threshold
    return (bytes + kPoolChunk - 1) / kPoolChunk * kPoolChunk;
  }
  void OnAllocated(std::uint64_t bytes) {
    used += bytes;
    used_high = std::max(used_high, used);
    reserved = std::max(reserved, Chunks(used));
    reserved_high = std::max(reserved_high, reserved);
  }
  // The release threshold is a ceiling: whole chunks go back while more than it is reserved (an
  // H100 kept 32 MiB of 128 under a 40 MiB threshold), never those that used memory needs.
  void OnReleased(std::uint64_t bytes) {
    used -= std::min(used, bytes);
    const std::uint64_t floor = std::max(Chunks(used), release_threshold / kPoolChunk * kPoolChunk);
    if (reserved > floor) reserved = floor;
  }
  // cuMemPoolTrimTo: a floor instead: chunks go back while the rest still holds `keep` bytes (the
  // same H100 trimmed 128 MiB to 64 MiB for minBytesToKeep = 40 MiB, and to 0 for 0).
  void TrimTo(std::uint64_t keep) {
    const std::uint64_t floor = std::max(Chunks(used), Chunks(keep));
    if (reserved > floor) reserved = floor;
  }
};

struct Context {
  int device = 0;
  unsigned flags = 0;
  int retain_count = 0;
  bool active = false;
  std::shared_ptr<Stream> legacy;
  std::map<std::thread::id, std::shared_ptr<Stream>> per_thread;
  // Every stream of this context that is live or still draining after destruction.
  std::vector<std::shared_ptr<Stream>> streams;
};

struct Device {
  int ordinal = 0;
  std::size_t capacity = 0;
  std::size_t used = 0;  // bytes charged against capacity
  Arena arena;
  Context primary;
  MemPool default_pool;
  MemPool* current_pool = &default_pool;
};

// ------------------------------------------------------------------------------------------------
// VMM (vmm.cpp)
// ------------------------------------------------------------------------------------------------

struct PhysicalAllocation {
  unsigned long long handle = 0;
  int fd = -1;
  std::size_t size = 0;
  CUmemAllocationProp prop{};
  int device = -1;       // device ordinal for device-located allocations
  std::size_t charged = 0;
  int refs = 1;          // cuMemCreate/Import/Retain minus cuMemRelease
  int mappings = 0;
  std::uint64_t id = 0;
};

struct Reservation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
};

// ------------------------------------------------------------------------------------------------
// Global state
// ------------------------------------------------------------------------------------------------

// A CUDA array or mipmapped array (arrays.cpp): an opaque handle over device memory the program
// never addresses. Its storage is a kArray region of its context, freed with the context.
struct CudaArray {
  Context* ctx = nullptr;
  std::uintptr_t region = 0;  // base of its kArray region in State::regions; 0 for a deferred mapping
  std::size_t bytes = 0;      // what its levels take, rows padded
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 0;  // mipmapped arrays: the number of levels; 0 for a plain array
};

struct State {
  std::mutex mu;
  // Waits on several streams at once (an op's dependencies, a context or device synchronization)
  // use `progress`, notified when any stream completes an op, and only while someone waits on it:
  // a wait on one stream uses that stream's `done`. With one shared condition every completion
  // woke every waiting thread to fight for `mu` (8 threads on 4 streams: 70% of the simulated
  // device's CPU was futex calls).
  std::condition_variable progress;
  int progress_waiters = 0;

  // Written under `mu`; atomic so that calls answered from the calling thread's own state
  // (cuCtxGetCurrent) can check them without the lock, as the real driver answers them.
  std::atomic<bool> initialized{false};  // cuInit succeeded
  std::atomic<bool> unusable_after_fork{false};
  std::vector<std::unique_ptr<Device>> devices;

  std::map<std::uintptr_t, Region> regions;
  // Ops queued (or running) on any stream that read or write device memory (Op::touches).
  std::uint64_t queued_touching_ops = 0;
  // Allocations cuMemFreeAsync gave back, base -> end, until an allocation takes the addresses
  // again: querying them is undefined in CUDA even after the stream reached the free.
  std::map<std::uintptr_t, std::uintptr_t> async_freed;
  std::unordered_map<const void*, std::shared_ptr<Stream>> streams;
  std::unordered_map<const void*, std::shared_ptr<Event>> events;
  std::unordered_map<const void*, std::shared_ptr<Graph>> graphs;
  std::unordered_map<const void*, std::shared_ptr<GraphExec>> graph_execs;
  std::unordered_map<const void*, std::unique_ptr<MemPool>> pools;  // user-created pools
  std::vector<std::shared_ptr<Capture>> captures;                    // capture sequences in progress
  std::unordered_map<unsigned long long, std::shared_ptr<PhysicalAllocation>> physical;
  std::map<std::uintptr_t, Reservation> reservations;
  std::unordered_map<std::uintptr_t, CudaArray> arrays;  // arrays.cpp: CUarray and CUmipmappedArray handles
  // fakecudaReuseArrayHandles: while on, the handle of the array (and of the mipmapped array) last
  // destroyed, which the next one made gets again (0: none).
  bool reuse_array_handles = false;
  std::uintptr_t reusable_array = 0, reusable_mipmapped_array = 0;

  std::uint64_t next_id = 1;

  // handles.h: the last minted handle's sequence number, and the destroyed handles.
  std::uint64_t handle_sequence = 0;
  struct Tombstone {
    HandleKind kind;
    const char* destroyed_by;
  };

  std::unordered_map<std::uintptr_t, Tombstone> tombstones;

  // Accounting exposed through the fakecuda* test hooks.
  std::uint64_t device_alloc_calls = 0;
  std::uint64_t device_free_calls = 0;
  std::uint64_t device_syncs = 0;
  std::map<std::tuple<std::string, int, unsigned long long>, std::uint64_t> proc_queries;
};

// Device memory in use as the driver reports it (cuMemGetInfo): the arena's allocations and what
// the device's memory pools reserve beyond them (memory_api.cpp). Under s.mu.
std::uint64_t DeviceUsedBytes(const State& s, const Device& dev);

// The process-wide state: created on first use, never destroyed, so that detached worker threads
// can keep touching it while the process runs exit().
State& GetState();

// Fresh identifiers (buffer ids, stream ids, capture ids...).
inline std::uint64_t NextId(State& s) { return s.next_id++; }

// ---- context.cpp ----
// CUDA_SUCCESS once cuInit has run in this process (and this is not a fork child of a CUDA process).
CUresult CheckInitialized(const State& s);
// The calling thread's current context, validated. CUDA_ERROR_INVALID_CONTEXT without one.
CUresult CurrentContext(State& s, Context** out);
CUresult GetDevice(State& s, CUdevice dev, Device** out);
Device& DeviceOf(State& s, const Context* ctx);
// A live context's handle (primary, or made by cuCtxCreate); any other value is misuse by `call`.
Context* ContextFromHandle(State& s, CUcontext h, const char* call);

// ---- device_memory.cpp ----
// Counts one device-memory allocation call (the FAKECUDA_FAIL_ALLOC counter) and returns true if
// this call must fail with CUDA_ERROR_OUT_OF_MEMORY.
bool CountAllocCallAndCheckFailure(State& s);
CUresult ChargeDevice(Device& dev, std::size_t bytes);
void UnchargeDevice(Device& dev, std::size_t bytes);
CUresult EnsureArena(Device& dev);
// Carves device memory from the arena and registers a region of `kind`.
CUresult AllocateArenaRegion(State& s, Context* ctx, std::size_t size, RegionKind kind, MemPool* pool,
                             std::uintptr_t* out);
// Host-memory backed kinds (managed, pinned host).
CUresult AllocateHostRegion(State& s, Context* ctx, std::size_t size, RegionKind kind, std::uintptr_t* out);
// Releases an arena/host region and forgets it.
void ReleaseRegion(State& s, std::uintptr_t base);
// The allocation at `base` was freed (cuMemFree, a cuMemFreeAsync reached, a free node run): given
// back (ReleaseRegion), save graph memory whose graph still exists, which waits unlaunched for the
// graph's next launch at the same address (Region::graph).
void ReleaseFreedRegion(State& s, std::uintptr_t base);
// The region containing address p, or nullptr.
Region* FindRegion(State& s, std::uintptr_t p);
// The base of the allocation cuMemFreeAsync gave back that held `p`, if no allocation took the
// address since; 0 otherwise.
std::uintptr_t AsyncFreedAt(const State& s, std::uintptr_t p);
// Who accesses memory, for the checks below: the call (named in a misuse line), and whether it
// is graph work, which may use graph memory no launch has made yet: a captured operation (of the
// capture that allocated it) or an explicit graph node.
struct Access {
  const char* call = "a copy";
  std::uint64_t capture_id = 0;  // the capture the operation is recorded into; 0: none
  bool graph_node = false;
  int device = -1;  // the device doing the access (its stream's); -1: not known here (see CheckDeviceRange)
};
// [p, p+n) must lie in one region the device may access (mapped, with access granted). Memory
// CUDA leaves undefined to touch stops the process: an address in the device's memory that no
// allocation holds (freed, or never allocated), an allocation freed in stream order (cuMemFreeAsync
// returned: "accessing the memory from any subsequent work ... results in undefined behavior"), and
// graph memory before the launch that makes it. Anything else outside the regions: invalid value.
CUresult CheckDeviceRange(State& s, std::uintptr_t p, std::size_t n, const Access& access);
// The reservation (cuMemAddressReserve) that holds all of [p, p+size), or nullptr (vmm.cpp).
Reservation* FindReservation(State& s, std::uintptr_t p, std::size_t size);
// Either side of a copy that names no direction (cuMemcpy): as CheckDeviceRange for addresses in
// device memory; anything else is pageable host memory and accepted.
CUresult CheckAnyRange(State& s, std::uintptr_t p, std::size_t n, const Access& access);
// The host side of cuMemcpyHtoD/DtoH: host memory (pageable, pinned, registered or managed).
// Device memory there stops the process ("dst and src pointers that do not match the direction of
// the copy results in an undefined behavior").
CUresult CheckHostRange(State& s, std::uintptr_t p, std::size_t n, const Access& access);

// ---- streams.cpp ----
// Maps a handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream) to a stream of the
// current context. `per_thread_default` selects what 0 means (true for the _ptsz/_ptds variants).
// `call` names the API call for a misuse report: a handle that is no live stream stops the process.
CUresult ResolveStream(State& s, CUstream h, bool per_thread_default, Stream** out, const char* call);
Stream* LegacyStream(State& s, Context* ctx);
Stream* PerThreadStream(State& s, Context* ctx);
std::shared_ptr<Stream> SharedStream(State& s, Stream* stream);
std::shared_ptr<Stream> CreateStream(State& s, Context* ctx, StreamKind kind, unsigned flags, int priority);

struct SubmitOptions {
  bool replayable = false;        // kept in the graph when the stream is capturing
  std::vector<Dep> extra_deps;    // e.g. cuStreamWaitEvent
  std::vector<Touch> touches;     // device memory the op accesses, where known
};
// Enqueues `run` on `stream` in stream order, applying the legacy-default-stream rules. A capturing
// stream records the op instead (replayable ops only) and never runs it.
CUresult Submit(State& s, Stream* stream, std::function<void()> run, SubmitOptions opts = {});
// A marker (an event record) on `stream` that is done the moment it is submitted: the stream is not
// capturing, nothing is queued on it, and the legacy-stream rules add nothing to wait for. Then
// MarkDone counts it submitted and completed at once, without the worker: a GPU completes such a
// marker within microseconds, where handing it to a worker thread took tens of microseconds on a
// loaded machine (the plain-free fences of the pools' benchmarks). CUDA_SUCCESS and *at_once false
// when it must be queued; an error of the legacy-stream rules as Submit would return it.
CUresult MarkerDoneAtOnce(State& s, Stream* stream, bool* at_once);
void MarkDone(State& s, Stream* stream);
// Enqueues and waits for completion (synchronous copies and memsets).
CUresult SubmitAndWait(State& s, std::unique_lock<std::mutex>& lk, Stream* stream, std::function<void()> run,
                       std::vector<Touch> touches = {});
void WaitForStream(State& s, std::unique_lock<std::mutex>& lk, std::shared_ptr<Stream> stream, std::uint64_t seq);
// Waits until every stream of the context (or of the device) has drained.
void SyncContext(State& s, std::unique_lock<std::mutex>& lk, Context* ctx);
void SyncDevice(State& s, std::unique_lock<std::mutex>& lk, int device);
void SyncAllDevices(State& s, std::unique_lock<std::mutex>& lk);
// The primary contexts' work only (cuMemUnmap's model: whether a GPU's unmap waits at all, and for
// which contexts, is not documented; the pools must not count on it for other contexts' streams).
void SyncPrimaryContexts(State& s, std::unique_lock<std::mutex>& lk);
// `call` is about to take [base, base + size) away from the device (cuMemUnmap). CUDA does not
// promise to wait for work queued there (PyTorch synchronizes before unmapping for that reason):
// work still queued on any stream of any context that accesses the range stops the process.
void RequireNoQueuedAccess(State& s, std::uintptr_t base, std::size_t size, const char* call);
// Marks a stream destroyed (by `call`: its handle is buried); its worker exits once the queue drains.
void RetireStream(State& s, const std::shared_ptr<Stream>& stream, const char* call);

// ---- capture.cpp ----
// Applies the stream-capture interaction rules (cuThreadExchangeStreamCaptureMode) to a
// "potentially unsafe" call made by this thread: synchronization, cuMemAlloc/cuMemFree, event
// queries. If prohibited, invalidates the offending capture sequences and returns
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
CUresult CheckUnsafeCall(State& s);
void InvalidateCapture(State& s, Capture& capture);
// For an operation a capture cannot record (synchronous, or a legacy callback): on a capturing
// stream it invalidates the capture and answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as CUDA
// does; CUDA_SUCCESS otherwise.
CUresult RefuseIfCapturing(State& s, Stream* stream);
// Work on the legacy stream may not depend on a capturing blocking stream: invalidates and returns
// CUDA_ERROR_STREAM_CAPTURE_IMPLICIT when it would.
CUresult CheckLegacyImplicitDependency(State& s, Context* ctx);
// Gives `graph` a handle (minted at capture begin, or now) and makes it live.
void PublishGraph(State& s, const std::shared_ptr<Graph>& graph);
// The live graph of a handle; any other value is misuse by `call`.
std::shared_ptr<Graph> LiveGraph(State& s, CUgraph h, const char* call);
// Releases graph memory owned by a graph that is no longer referenced.
void MaybeReleaseGraph(State& s, const std::shared_ptr<Graph>& graph);
// Ends every capture sequence that involves a stream of `ctx` (context reset).
void DropCapturesOfContext(State& s, Context* ctx);
// Ends a capture sequence without producing a graph (its origin stream is being destroyed).
void AbandonCapture(State& s, std::shared_ptr<Capture> capture);

// ---- modules.cpp ----
// Validates a kernel launch like cuLaunchKernel and builds the op that runs it (its stand-in, or
// nothing), with the arguments copied now.
CUresult PrepareKernelOp(State& s, CUfunction f, const unsigned grid[3], const unsigned block[3],
                         unsigned shared_bytes, void** kernelParams, void** extra, std::function<void()>* out);

// ---- graph_nodes.cpp ----
// Remembers a node added to an explicit graph (cuGraphGetNodes, dependency checks).
CUgraphNode AddGraphNodeHandle(State& s, Graph* graph);

// ---- user_contexts.cpp ----
// A live context made by cuCtxCreate, or nullptr.
Context* CreatedContextFromHandle(CUcontext h);
// Every live context made by cuCtxCreate (under s.mu).
std::vector<Context*> CreatedContexts();

// ---- ipc_events.cpp ----
// Interprocess events: a record bumps the shared "recorded" count and its op publishes it as
// "completed"; waiters compare the two.
std::shared_ptr<IpcEventPage> CreateIpcEventPage();
std::uint64_t IpcEventRecorded(const IpcEventPage& page);  // counts a new record, returns its number
std::uint64_t IpcEventTarget(const IpcEventPage& page);    // the newest record's number
void IpcEventComplete(const IpcEventPage& page, std::uint64_t record);
bool IpcEventDone(const IpcEventPage& page, std::uint64_t record);

// ---- context.cpp ----
// Frees everything owned by a context (streams, events, memory) and marks it inactive.
// `keep_pool_memory`: cuCtxDestroy leaves stream-ordered allocations alone, like CUDA (they belong
// to their memory pool, not to the context).
// Every handle of the context (streams, events, graphs, graph execs; for a primary context also
// the device's created memory pools) is buried as destroyed by `call`.
void DeactivateContext(State& s, std::unique_lock<std::mutex>& lk, Context* ctx, const char* call,
                       bool keep_pool_memory = false);

}  // namespace fakecuda
