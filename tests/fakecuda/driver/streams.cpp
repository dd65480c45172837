// Streams: ordered queues of host-side "device work", one worker thread per stream.
//
// Ordering is expressed as dependencies between op numbers: op k of stream S is done once
// S.completed >= k. The legacy default stream rules become dependencies added at submit time:
//   * work on the legacy stream waits for everything already submitted to every blocking stream
//     of the context;
//   * work on a blocking stream waits for everything already submitted to the legacy stream.
// Non-blocking streams (CU_STREAM_NON_BLOCKING) get neither. The per-thread default stream is an
// ordinary blocking stream, one per (thread, context).
//
// Worker threads are created lazily on first submit and detached. All state they touch is never
// destroyed (GetState() leaks it on purpose), so a process may exit() with work still queued:
// exit_group simply ends the workers.
#include <pthread.h>

#include <algorithm>

#include "driver.h"

namespace fakecuda {
namespace {

bool DepsSatisfied(const std::vector<Dep>& deps) {
  return std::all_of(deps.begin(), deps.end(), [](const Dep& d) { return d.stream->completed >= d.seq; });
}

// A wait on several streams (State::progress says why they share one condition).
template <class Pred>
void WaitForStreams(State& s, std::unique_lock<std::mutex>& lk, Pred done) {
  if (done()) return;
  ++s.progress_waiters;
  s.progress.wait(lk, done);
  --s.progress_waiters;
}

// `stream` completed an op (called with `mu` held).
void NotifyCompleted(State& s, Stream* stream) {
  stream->done.notify_all();
  if (s.progress_waiters > 0) s.progress.notify_all();
}

// The op about to run on `stream` touches stream-ordered memory whose allocating stream has not
// reached the allocation: nothing orders the op after it (an event, a synchronization, the legacy
// stream's implicit waits would have), so CUDA leaves it undefined. Checked as the op starts, when
// every dependency it has is met: a program that orders it correctly never gets here.
void RequireAllocationsReached(State& s, const Stream* stream, const std::vector<Touch>& touches) {
  for (const Touch& t : touches) {
    const Region* r = FindRegion(s, t.base);
    if (r == nullptr || r->kind != RegionKind::kDeviceAsync) continue;
    const std::shared_ptr<Stream> by = r->alloc_stream.lock();
    if (by == nullptr || by.get() == stream || by->completed >= r->alloc_seq) continue;
    Misuse("work on stream %#lx accesses [%#lx, %#lx) before stream %#lx reached its allocation (cuMemAllocAsync): "
           "CUDA says it \"must not be accessed until the allocation operation completes\"; order the work after it "
           "(an event recorded after the allocation)",
           static_cast<unsigned long>(stream->handle), static_cast<unsigned long>(t.base),
           static_cast<unsigned long>(t.base + t.size), static_cast<unsigned long>(by->handle));
  }
}

// Runs the op at the front of `stream`'s queue (its `run`, taken out under `lk`) without the lock,
// then completes it: pops it, counts it and wakes whoever waits for it.
void RunFront(State& s, std::unique_lock<std::mutex>& lk, Stream* stream, std::function<void()> run) {
  RequireAllocationsReached(s, stream, stream->queue.front().touches);
  lk.unlock();
  if (run) run();
  run = nullptr;  // the op's captures are destroyed outside the lock too
  lk.lock();
  if (!stream->queue.front().touches.empty()) --s.queued_touching_ops;
  stream->queue.pop_front();
  ++stream->completed;
  NotifyCompleted(s, stream);
}

void ForgetStream(Context* ctx, const Stream* stream) {
  auto& v = ctx->streams;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == stream; }), v.end());
}

void WorkerMain(std::shared_ptr<Stream> stream) {
  pthread_setname_np(pthread_self(), "fakecuda-strm");
  State& s = GetState();
  std::unique_lock lk(s.mu);
  while (true) {
    stream->wake.wait(lk, [&] {
      return stream->queue.empty() ? stream->retired : !stream->queue.front().on_caller;
    });
    if (stream->queue.empty()) break;  // retired and drained
    // References to deque elements survive push_back by submitters; only this thread pops.
    Op& op = stream->queue.front();
    WaitForStreams(s, lk, [&] { return DepsSatisfied(op.deps); });
    op.deps.clear();
    RunFront(s, lk, stream.get(), std::move(op.run));
  }
  ForgetStream(stream->ctx, stream.get());
  s.progress.notify_all();
}

CUresult StartWorker(const std::shared_ptr<Stream>& stream) {
  if (stream->worker_started) return CUDA_SUCCESS;
  try {
    std::thread(WorkerMain, stream).detach();
  } catch (const std::system_error&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  stream->worker_started = true;
  return CUDA_SUCCESS;
}

}  // namespace

std::shared_ptr<Stream> CreateStream(State& s, Context* ctx, StreamKind kind, unsigned flags, int priority) {
  auto st = std::make_shared<Stream>();
  st->id = NextId(s);
  st->ctx = ctx;
  st->kind = kind;
  st->flags = flags;
  st->priority = priority;
  ctx->streams.push_back(st);
  if (kind == StreamKind::kUser) {
    st->handle = MintHandle(s, HandleKind::kStream);
    s.streams[reinterpret_cast<const void*>(st->handle)] = st;
  }
  return st;
}

std::shared_ptr<Stream> SharedStream(State& s, Stream* stream) {
  (void)s;
  return stream->shared_from_this();
}

Stream* LegacyStream(State& s, Context* ctx) {
  if (!ctx->legacy) ctx->legacy = CreateStream(s, ctx, StreamKind::kLegacy, 0, 0);
  return ctx->legacy.get();
}

Stream* PerThreadStream(State& s, Context* ctx) {
  auto& slot = ctx->per_thread[std::this_thread::get_id()];
  if (!slot) slot = CreateStream(s, ctx, StreamKind::kPerThread, 0, 0);
  return slot.get();
}

CUresult ResolveStream(State& s, CUstream h, bool per_thread_default, Stream** out, const char* call) {
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  const bool is_null = (h == nullptr);
  if (is_null || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    Context* ctx = nullptr;
    if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
    const bool per_thread = (h == CU_STREAM_PER_THREAD) || (is_null && per_thread_default);
    *out = per_thread ? PerThreadStream(s, ctx) : LegacyStream(s, ctx);
    return CUDA_SUCCESS;
  }
  auto it = s.streams.find(h);
  // A stream of a reset or destroyed context was retired with it, so it is not found either.
  if (it == s.streams.end()) BadHandle(s, call, HandleKind::kStream, reinterpret_cast<std::uintptr_t>(h));
  *out = it->second.get();
  return CUDA_SUCCESS;
}

namespace {

// The op for `run` on `stream` (not capturing), with the legacy-default-stream rules' dependencies.
CUresult MakeOp(State& s, Stream* stream, std::function<void()> run, SubmitOptions opts, Op* out) {
  Context* ctx = stream->ctx;
  Op& op = *out;
  op.run = std::move(run);
  op.deps = std::move(opts.extra_deps);
  op.touches = std::move(opts.touches);
  if (stream->kind == StreamKind::kLegacy) {
    if (CUresult r = CheckLegacyImplicitDependency(s, ctx); r != CUDA_SUCCESS) return r;
    for (const auto& other : ctx->streams) {
      if (other.get() != stream && other->blocking() && !other->idle()) op.deps.push_back({other, other->submitted});
    }
  } else if (stream->blocking()) {
    Stream* legacy = LegacyStream(s, ctx);
    if (!legacy->idle()) op.deps.push_back({ctx->legacy, legacy->submitted});
  }
  return CUDA_SUCCESS;
}

// Hands `op` to the stream's worker, after everything queued on the stream.
CUresult Enqueue(State& s, Stream* stream, Op op) {
  if (CUresult r = StartWorker(SharedStream(s, stream)); r != CUDA_SUCCESS) return r;
  if (!op.touches.empty()) ++s.queued_touching_ops;
  stream->queue.push_back(std::move(op));
  ++stream->submitted;
  stream->wake.notify_one();
  return CUDA_SUCCESS;
}

// Runs a synchronous op on the calling thread, as the stream's worker would have: nothing is queued
// before it and its dependencies are met, so handing it to the worker would only cost two thread
// switches (tens of microseconds on a loaded machine, where a GPU answers a small synchronous copy
// in a few). It stays at the queue's front while it runs: ops submitted meanwhile wait behind it,
// and RequireNoQueuedAccess sees what it touches.
void RunOnCaller(State& s, std::unique_lock<std::mutex>& lk, Stream* stream, Op op) {
  const std::shared_ptr<Stream> keep = SharedStream(s, stream);  // a destroy meanwhile must not free it
  std::function<void()> run = std::move(op.run);
  op.deps.clear();
  op.on_caller = true;
  if (!op.touches.empty()) ++s.queued_touching_ops;
  stream->queue.push_back(std::move(op));
  ++stream->submitted;
  RunFront(s, lk, stream, std::move(run));
  if (stream->worker_started) stream->wake.notify_one();  // ops queued behind it, or its retirement
  else if (stream->retired && stream->queue.empty()) ForgetStream(stream->ctx, stream);
}

}  // namespace

CUresult Submit(State& s, Stream* stream, std::function<void()> run, SubmitOptions opts) {
  if (stream->capture) {
    // Captured work is recorded into the graph, never executed now.
    if (stream->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    NoteCapturedNode(*stream->capture, stream);
    if (opts.replayable && run) {
      Graph& g = *stream->capture->graph;
      g.nodes.push_back(std::move(run));
      g.touches.insert(g.touches.end(), opts.touches.begin(), opts.touches.end());
    }
    return CUDA_SUCCESS;
  }
  Op op;
  if (CUresult r = MakeOp(s, stream, std::move(run), std::move(opts), &op); r != CUDA_SUCCESS) return r;
  return Enqueue(s, stream, std::move(op));
}

CUresult MarkerDoneAtOnce(State& s, Stream* stream, bool* at_once) {
  *at_once = false;
  if (stream->capture || !stream->idle()) return CUDA_SUCCESS;
  Context* ctx = stream->ctx;
  if (stream->kind == StreamKind::kLegacy) {
    if (CUresult r = CheckLegacyImplicitDependency(s, ctx); r != CUDA_SUCCESS) return r;
    for (const auto& other : ctx->streams)
      if (other.get() != stream && other->blocking() && !other->idle()) return CUDA_SUCCESS;
  } else if (stream->blocking() && !LegacyStream(s, ctx)->idle()) {
    return CUDA_SUCCESS;
  }
  *at_once = true;
  return CUDA_SUCCESS;
}

void MarkDone(State& s, Stream* stream) {
  ++stream->submitted;
  ++stream->completed;
  NotifyCompleted(s, stream);
}

void WaitForStream(State& /*s: `lk` holds its mu*/, std::unique_lock<std::mutex>& lk, std::shared_ptr<Stream> stream,
                   std::uint64_t seq) {
  // `stream` is the wait's own reference: a caller's may change while it sleeps (an event
  // recorded again elsewhere), and the condition slept on must outlive the wait.
  stream->done.wait(lk, [&] { return stream->completed >= seq; });
}

CUresult SubmitAndWait(State& s, std::unique_lock<std::mutex>& lk, Stream* stream, std::function<void()> run,
                       std::vector<Touch> touches) {
  // A synchronous operation cannot be captured.
  if (CUresult r = RefuseIfCapturing(s, stream); r != CUDA_SUCCESS) return r;
  SubmitOptions opts;
  opts.touches = std::move(touches);  // queued meanwhile: another thread may unmap under it
  Op op;
  if (CUresult r = MakeOp(s, stream, std::move(run), std::move(opts), &op); r != CUDA_SUCCESS) return r;
  if (stream->queue.empty() && DepsSatisfied(op.deps)) {
    RunOnCaller(s, lk, stream, std::move(op));
    return CUDA_SUCCESS;
  }
  if (CUresult r = Enqueue(s, stream, std::move(op)); r != CUDA_SUCCESS) return r;
  WaitForStream(s, lk, SharedStream(s, stream), stream->submitted);
  return CUDA_SUCCESS;
}

void SyncContext(State& s, std::unique_lock<std::mutex>& lk, Context* ctx) {
  std::vector<Dep> targets;
  for (const auto& st : ctx->streams) {
    if (!st->idle()) targets.push_back({st, st->submitted});
  }
  WaitForStreams(s, lk, [&] { return DepsSatisfied(targets); });
}

namespace {

// Every live context on `device` (every device when it is negative): its primary context and the
// ones the program created. A device's work is all of them: cuMemFree waits for the streams of a
// cuCtxCreate context as for the primary one's.
std::vector<Context*> ContextsOf(State& s, int device, bool created = true) {
  std::vector<Context*> out;
  for (const auto& dev : s.devices)
    if (device < 0 || dev->ordinal == device) out.push_back(&dev->primary);
  if (created)
    for (Context* ctx : CreatedContexts())
      if (device < 0 || ctx->device == device) out.push_back(ctx);
  return out;
}

void SyncContexts(State& s, std::unique_lock<std::mutex>& lk, int device, bool created = true) {
  std::vector<Dep> targets;
  for (Context* ctx : ContextsOf(s, device, created))
    for (const auto& st : ctx->streams)
      if (!st->idle()) targets.push_back({st, st->submitted});
  WaitForStreams(s, lk, [&] { return DepsSatisfied(targets); });
}

}  // namespace

void SyncDevice(State& s, std::unique_lock<std::mutex>& lk, int device) {
  if (device < 0 || device >= static_cast<int>(s.devices.size())) return;
  SyncContexts(s, lk, device);
}

void SyncAllDevices(State& s, std::unique_lock<std::mutex>& lk) { SyncContexts(s, lk, -1); }

void SyncPrimaryContexts(State& s, std::unique_lock<std::mutex>& lk) { SyncContexts(s, lk, -1, /*created=*/false); }

void RequireNoQueuedAccess(State& s, std::uintptr_t base, std::size_t size, const char* call) {
  // Asked at every stream-ordered free: a loop of them queues thousands of ops that touch nothing.
  if (s.queued_touching_ops == 0) return;
  // A context's list holds its destroyed streams too until they drain: their work still runs.
  for (Context* ctx : ContextsOf(s, -1)) {
    for (const auto& st : ctx->streams) {
      for (const Op& op : st->queue) {
        for (const Touch& t : op.touches) {
          if (t.base < base + size && base < t.base + t.size) {
            Misuse("%s of [%#lx, %#lx) while work queued on stream %#lx still accesses [%#lx, %#lx): CUDA does not "
                   "wait for it (undefined on a GPU); wait for that work first",
                   call, static_cast<unsigned long>(base), static_cast<unsigned long>(base + size),
                   static_cast<unsigned long>(st->handle), static_cast<unsigned long>(t.base),
                   static_cast<unsigned long>(t.base + t.size));
          }
        }
      }
    }
  }
}

void RetireStream(State& s, const std::shared_ptr<Stream>& stream, const char* call) {
  stream->retired = true;
  if (stream->handle != 0) {
    s.streams.erase(reinterpret_cast<const void*>(stream->handle));
    BuryHandle(s, HandleKind::kStream, stream->handle, call);
  }
  if (stream->capture) {
    if (stream->capture->origin == stream.get()) {
      AbandonCapture(s, stream->capture);  // nobody can end it any more
    } else {
      auto& members = stream->capture->streams;
      members.erase(std::remove(members.begin(), members.end(), stream), members.end());
      stream->capture.reset();
    }
  }
  // A stream with an op still running on a caller (RunOnCaller) stays listed until it is done: a
  // context synchronization, the legacy stream's dependencies and cuMemUnmap's check must see it.
  if (!stream->worker_started) {
    if (stream->queue.empty()) ForgetStream(stream->ctx, stream.get());
  } else {
    stream->wake.notify_one();
  }
}

}  // namespace fakecuda

using namespace fakecuda;

namespace {

CUresult CreateUserStream(CUstream* phStream, unsigned int flags, int priority) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (phStream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Priorities: [-5, 0] like recent GPUs (lower is higher priority); out-of-range values clamp.
  std::shared_ptr<Stream> st = CreateStream(s, ctx, StreamKind::kUser, flags, std::clamp(priority, -5, 0));
  *phStream = reinterpret_cast<CUstream>(st->handle);
  return CUDA_SUCCESS;
}

CUresult StreamSynchronize(CUstream hStream, bool ptsz) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamSynchronize"); r != CUDA_SUCCESS) return r;
  if (CUresult r = RefuseIfCapturing(s, st); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  WaitForStream(s, lk, SharedStream(s, st), st->submitted);
  return CUDA_SUCCESS;
}

CUresult StreamQuery(CUstream hStream, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamQuery"); r != CUDA_SUCCESS) return r;
  if (CUresult r = RefuseIfCapturing(s, st); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  return st->idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult StreamGetFlags(CUstream hStream, unsigned int* flags, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamGetFlags"); r != CUDA_SUCCESS) return r;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = st->flags;
  return CUDA_SUCCESS;
}

CUresult StreamGetPriority(CUstream hStream, int* priority, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamGetPriority"); r != CUDA_SUCCESS) return r;
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *priority = st->priority;
  return CUDA_SUCCESS;
}

CUresult StreamGetCtx(CUstream hStream, CUcontext* pctx, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamGetCtx"); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(st->ctx);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) { return CreateUserStream(phStream, Flags, 0); }

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return CreateUserStream(phStream, flags, priority);
}

namespace {
CUresult StreamDestroy(CUstream hStream, const char* call) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  // The default streams are not the program's to destroy: an H100 answers
  // CUDA_ERROR_INVALID_HANDLE for 0 and CU_STREAM_LEGACY (2026-11-26), and does not crash.
  if (hStream == nullptr || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  auto it = s.streams.find(hStream);
  if (it == s.streams.end()) BadHandle(s, call, HandleKind::kStream, reinterpret_cast<std::uintptr_t>(hStream));
  // Like CUDA, destruction returns at once; queued work still completes, then the worker exits.
  std::shared_ptr<Stream> st = it->second;
  RetireStream(s, st, call);
  return CUDA_SUCCESS;
}
}  // namespace

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) { return StreamDestroy(hStream, "cuStreamDestroy"); }
CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) { return StreamDestroy(hStream, "cuStreamDestroy_v2"); }

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { return StreamSynchronize(hStream, false); }
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) { return StreamSynchronize(hStream, true); }
CUresult CUDAAPI cuStreamQuery(CUstream hStream) { return StreamQuery(hStream, false); }
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) { return StreamQuery(hStream, true); }
CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) { return StreamGetFlags(hStream, flags, false); }
CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  return StreamGetFlags(hStream, flags, true);
}
CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int* priority) {
  return StreamGetPriority(hStream, priority, false);
}
CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hStream, int* priority) {
  return StreamGetPriority(hStream, priority, true);
}
CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext* pctx) { return StreamGetCtx(hStream, pctx, false); }
CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) { return StreamGetCtx(hStream, pctx, true); }

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = -5;
  return CUDA_SUCCESS;
}
