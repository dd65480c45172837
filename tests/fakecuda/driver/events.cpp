// Events: markers in stream order. An event is complete when the stream has executed its record op.
//
// cuStreamWaitEvent is a dependency on that op; inside stream capture it instead joins the waiting
// stream to the capture sequence the event was recorded in (fork/join capture).
#include <algorithm>

#include "driver.h"

namespace fakecuda {
namespace {

CUresult LookupEvent(State& s, CUevent h, std::shared_ptr<Event>* out, const char* call) {
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  auto it = s.events.find(h);
  if (it == s.events.end()) BadHandle(s, call, HandleKind::kEvent, reinterpret_cast<std::uintptr_t>(h));
  *out = it->second;
  return CUDA_SUCCESS;
}

bool CaptureInProgress(const State& s, const std::shared_ptr<Capture>& c) {
  return std::find(s.captures.begin(), s.captures.end(), c) != s.captures.end();
}

bool EventComplete(const Event& e) {
  if (e.ipc) return IpcEventDone(*e.ipc, IpcEventTarget(*e.ipc));
  return !e.recorded || e.stream->completed >= e.seq;
}

// Checks shared by query and synchronize: both are "potentially unsafe" during capture, and an
// event last recorded inside a capture has no completion to observe.
CUresult CheckEventObservable(State& s, Event& e) {
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (e.capture) {
    if (CaptureInProgress(s, e.capture)) InvalidateCapture(s, *e.capture);
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  return CUDA_SUCCESS;
}

CUresult EventRecord(CUevent hEvent, CUstream hStream, unsigned int flags, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::shared_ptr<Event> ev;
  if (CUresult r = LookupEvent(s, hEvent, &ev, "cuEventRecord"); r != CUDA_SUCCESS) return r;
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuEventRecord"); r != CUDA_SUCCESS) return r;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  // "hStream and hEvent must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE is
  // returned" (cuEventRecord); an H100 answers so (2026-11-26).
  if (ev->ctx != st->ctx) return CUDA_ERROR_INVALID_HANDLE;

  if (st->capture) {
    if (st->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    ev->capture = st->capture;  // becomes a node of the graph; usable for cross-stream joins
    // What a wait on it depends on: what this stream depends on, and its own nodes so far.
    ev->capture_depends = st->capture->depends[st];
    ev->capture_depends[st] = st->capture->nodes[st];
    return CUDA_SUCCESS;
  }
  if (ev->ipc) {
    const std::uint64_t record = IpcEventRecorded(*ev->ipc);
    CUresult r = Submit(s, st, [page = ev->ipc, record] { IpcEventComplete(*page, record); });
    if (r != CUDA_SUCCESS) return r;
    ev->recorded = true;
    ev->stream = SharedStream(s, st);
    ev->seq = st->submitted;
    return CUDA_SUCCESS;
  }
  const std::uint64_t generation = ++ev->generation;
  bool at_once = false;
  if (CUresult r = MarkerDoneAtOnce(s, st, &at_once); r != CUDA_SUCCESS) return r;
  if (at_once) {
    MarkDone(s, st);
    ev->capture.reset();
    ev->recorded = true;
    ev->timestamp = std::chrono::steady_clock::now();
    ev->timestamp_valid = true;
    ev->stream = SharedStream(s, st);
    ev->seq = st->submitted;
    return CUDA_SUCCESS;
  }
  CUresult r = Submit(s, st, [ev, generation] {
    State& state = GetState();
    std::lock_guard inner(state.mu);
    if (ev->generation == generation) {
      ev->timestamp = std::chrono::steady_clock::now();
      ev->timestamp_valid = true;
    }
  });
  if (r != CUDA_SUCCESS) return r;
  ev->capture.reset();
  ev->recorded = true;
  ev->timestamp_valid = false;
  ev->stream = SharedStream(s, st);
  ev->seq = st->submitted;
  return CUDA_SUCCESS;
}

CUresult StreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags, bool ptsz) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, ptsz, &st, "cuStreamWaitEvent"); r != CUDA_SUCCESS) return r;
  std::shared_ptr<Event> ev;
  if (CUresult r = LookupEvent(s, hEvent, &ev, "cuStreamWaitEvent"); r != CUDA_SUCCESS) return r;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;

  if (ev->capture) {
    const std::shared_ptr<Capture> cap = ev->capture;
    if (!CaptureInProgress(s, cap)) return CUDA_ERROR_CAPTURED_EVENT;
    auto depend_on_event = [&] {
      std::map<const Stream*, std::uint64_t>& mine = cap->depends[st];
      for (const auto& [stream, nodes] : ev->capture_depends) mine[stream] = std::max(mine[stream], nodes);
    };
    if (st->capture == cap) {  // a join within the capture
      depend_on_event();
      return CUDA_SUCCESS;
    }
    if (st->capture) {  // two different capture sequences would merge
      InvalidateCapture(s, *st->capture);
      InvalidateCapture(s, *cap);
      return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    if (st->kind == StreamKind::kLegacy) {
      InvalidateCapture(s, *cap);
      return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    // Fork: the waiting stream joins the capture; its later work is recorded, not run.
    st->capture = cap;
    cap->streams.push_back(SharedStream(s, st));
    depend_on_event();
    return CUDA_SUCCESS;
  }
  if (st->capture) {
    if (st->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!ev->recorded || (flags & CU_EVENT_WAIT_EXTERNAL) != 0) return CUDA_SUCCESS;
    // A captured graph cannot depend on work outside the capture.
    InvalidateCapture(s, *st->capture);
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (ev->ipc) {
    // Another process may record it: the stream waits, on its worker, for the newest record now.
    const std::uint64_t record = IpcEventTarget(*ev->ipc);
    if (IpcEventDone(*ev->ipc, record)) return CUDA_SUCCESS;
    return Submit(s, st, [page = ev->ipc, record] {
      while (!IpcEventDone(*page, record)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
  }
  if (!ev->recorded || EventComplete(*ev)) return CUDA_SUCCESS;
  SubmitOptions opts;
  opts.extra_deps.push_back({ev->stream, ev->seq});
  return Submit(s, st, nullptr, std::move(opts));
}

CUresult ElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::shared_ptr<Event> start, end;
  if (CUresult r = LookupEvent(s, hStart, &start, "cuEventElapsedTime"); r != CUDA_SUCCESS) return r;
  if (CUresult r = LookupEvent(s, hEnd, &end, "cuEventElapsedTime"); r != CUDA_SUCCESS) return r;
  if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (start->capture || end->capture) return CUDA_ERROR_CAPTURED_EVENT;
  if ((start->flags & CU_EVENT_DISABLE_TIMING) || (end->flags & CU_EVENT_DISABLE_TIMING)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (!EventComplete(*start) || !EventComplete(*end)) return CUDA_ERROR_NOT_READY;
  if (!start->timestamp_valid || !end->timestamp_valid) return CUDA_ERROR_NOT_READY;
  const std::chrono::duration<float, std::milli> ms = end->timestamp - start->timestamp;
  *pMilliseconds = ms.count();
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned kValid = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (Flags & ~kValid) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Interprocess events must disable timing, as in CUDA.
  if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  auto ev = std::make_shared<Event>();
  ev->ctx = ctx;
  ev->flags = Flags;
  if (Flags & CU_EVENT_INTERPROCESS) {
    ev->ipc = CreateIpcEventPage();
    if (!ev->ipc) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ev->handle = MintHandle(s, HandleKind::kEvent);
  s.events[reinterpret_cast<const void*>(ev->handle)] = ev;
  *phEvent = reinterpret_cast<CUevent>(ev->handle);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  // A pending record keeps the object alive through its op; the handle dies now.
  if (s.events.erase(hEvent) == 0) BadHandle(s, "cuEventDestroy_v2", HandleKind::kEvent, reinterpret_cast<std::uintptr_t>(hEvent));
  BuryHandle(s, HandleKind::kEvent, reinterpret_cast<std::uintptr_t>(hEvent), "cuEventDestroy_v2");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) { return EventRecord(hEvent, hStream, 0, false); }
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return EventRecord(hEvent, hStream, 0, true); }
CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return EventRecord(hEvent, hStream, flags, false);
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return EventRecord(hEvent, hStream, flags, true);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::shared_ptr<Event> ev;
  if (CUresult r = LookupEvent(s, hEvent, &ev, "cuEventQuery"); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckEventObservable(s, *ev); r != CUDA_SUCCESS) return r;
  if (GetConfig().broken_events) return CUDA_SUCCESS;
  return EventComplete(*ev) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  State& s = GetState();
  std::unique_lock lk(s.mu);
  std::shared_ptr<Event> ev;
  if (CUresult r = LookupEvent(s, hEvent, &ev, "cuEventSynchronize"); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckEventObservable(s, *ev); r != CUDA_SUCCESS) return r;
  if (ev->ipc) {
    const std::shared_ptr<IpcEventPage> page = ev->ipc;
    const std::uint64_t record = IpcEventTarget(*page);
    lk.unlock();
    while (!IpcEventDone(*page, record)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    return CUDA_SUCCESS;
  }
  if (ev->recorded) WaitForStream(s, lk, ev->stream, ev->seq);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return ElapsedTime(pMilliseconds, hStart, hEnd);
}
CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return ElapsedTime(pMilliseconds, hStart, hEnd);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return StreamWaitEvent(hStream, hEvent, Flags, false);
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return StreamWaitEvent(hStream, hEvent, Flags, true);
}
