#include "trace/trace_recorder.h"

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "util/clock.h"
#include "util/log.h"
#include "util/own_threads.h"
#include "util/write_fully.h"
#include "util/thread_block.h"

namespace gpushim::trace {

struct TraceRecorder::ThreadBuffer {
  explicit ThreadBuffer(size_t events) : ring(events) {}
  EventRing ring;
  uint64_t pending_drops = 0;               // owning thread only: dropped since the last marker
  std::atomic<uint64_t> dropped_total{0};   // owning thread writes, the writer reads
  std::atomic<bool> orphaned{false};        // its thread exited; recycle once drained
  TraceRecorder* owner = nullptr;
};

namespace {

// Payload size at which an events or stacks chunk is closed: small enough that a crash loses
// little, large enough that the 16-byte chunk header costs nothing.
constexpr size_t kChunkTarget = 64 * 1024;
// Written output is flushed to the file past this size even within one drain.
constexpr size_t kWriteTarget = 512 * 1024;
// An idle writer backs off to this interval, so an idle process pays almost nothing; short enough
// that a burst after a quiet spell is on disk soon (a crash loses at most this much).
constexpr unsigned kMaxIdleIntervalMs = 250;

std::atomic<uint64_t> g_next_generation{1};

// The calling thread's buffer, tagged with the recorder generation it belongs to. Trivial, so it
// needs no TLS constructor or destructor; a slot of the front's static TLS block
// (util/thread_block.h).
struct BufferSlot {
  uint64_t generation;
  void* buffer;
};
BufferSlot& this_thread_buffer() { return thread_slot<BufferSlot, ThreadSlot::kTraceBuffer>(); }

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

}  // namespace

std::unique_ptr<TraceRecorder> TraceRecorder::start(int fd, std::string path, const HeaderInfo& header,
                                                    const StackTable* stacks, RecorderOptions options) {
  if (options.ring_events < 64 || (options.ring_events & (options.ring_events - 1)) != 0) options.ring_events = 4096;
  if (options.flush_interval_ms == 0) options.flush_interval_ms = 50;
  std::unique_ptr<TraceRecorder> r(new TraceRecorder(fd, std::move(path), stacks, options));
  std::string head(kFileMagic, sizeof(kFileMagic));
  append_chunk(&head, ChunkType::kHeader, encode_header(header));
  if (!r->write_out(head)) return nullptr;  // write_out logged it
  r->exit_key_ok_ = pthread_key_create(&r->exit_key_, &TraceRecorder::on_thread_exit) == 0;
  // The writer must not take the host's signals: block them all in it (it inherits our mask).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const int err = pthread_create(&r->writer_, nullptr, &TraceRecorder::writer_main, r.get());
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (err != 0) {
    log_line("cannot start the trace writer thread: %s; no trace is recorded", std::strerror(err));
    return nullptr;
  }
  r->writer_started_ = true;
  return r;
}

TraceRecorder::TraceRecorder(int fd, std::string path, const StackTable* stacks, RecorderOptions options)
    : fd_(fd),
      path_(std::move(path)),
      stacks_(stacks),
      options_(options),
      generation_(g_next_generation.fetch_add(1, std::memory_order_relaxed)) {
  batch_.reserve(options_.ring_events);
  struct stat st;
  if (::fstat(fd_, &st) == 0) {
    file_dev_ = st.st_dev;
    file_ino_ = st.st_ino;
    file_known_ = true;
  }
}

TraceRecorder::~TraceRecorder() {
  accepting_.store(false, std::memory_order_release);
  stop_.store(true, std::memory_order_release);
  wake_writer();
  // The writer itself ends the process when the program's threads are gone (util/own_threads.h):
  // then the exit path runs on it, and it must not wait for itself.
  if (writer_started_ && !pthread_equal(writer_, pthread_self())) pthread_join(writer_, nullptr);
  {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (!finished_ && !child_) {
      drain_and_write();
      if (!fd_lost_) ::close(fd_);
      finished_ = true;
    }
  }
  if (exit_key_ok_) pthread_key_delete(exit_key_);
}

// ---- producers ----

void TraceRecorder::record(const TraceEvent& e) {
  if (!accepting_.load(std::memory_order_relaxed)) return;
  BufferSlot& slot = this_thread_buffer();
  ThreadBuffer* b = static_cast<ThreadBuffer*>(slot.buffer);
  if (slot.generation != generation_) {
    b = attach_thread();
    if (b == nullptr) return;
    slot.generation = generation_;
    slot.buffer = b;
  }
  if (b->pending_drops != 0) {
    // Say where events went missing before recording anything after the gap.
    if (!b->ring.has_room(2)) {
      ++b->pending_drops;
      b->dropped_total.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    TraceEvent marker = e;
    marker.kind = EventKind::kDropped;
    marker.size = b->pending_drops;
    marker.addr = marker.requested = 0;
    marker.stack = 0;
    b->ring.push(marker);
    b->pending_drops = 0;
  }
  if (!b->ring.has_room(1)) {
    ++b->pending_drops;
    b->dropped_total.fetch_add(1, std::memory_order_relaxed);
    wake_writer();
    return;
  }
  const uint64_t filled = b->ring.push(e);
  // Wake the writer when the ring is half full (and every 256 events past that), so a busy thread
  // does not wait for the timer.
  const uint64_t half = b->ring.capacity() / 2;
  if (filled == half || (filled > half && (filled & 255) == 0)) wake_writer();
}

TraceRecorder::ThreadBuffer* TraceRecorder::attach_thread() {
  std::lock_guard<std::mutex> lock(registry_mu_);
  ThreadBuffer* b = nullptr;
  if (!idle_buffers_.empty()) {
    b = idle_buffers_.back();
    idle_buffers_.pop_back();
  } else {
    auto fresh = std::make_unique<ThreadBuffer>(options_.ring_events);
    fresh->owner = this;
    b = fresh.get();
    buffers_.push_back(std::move(fresh));
  }
  b->orphaned.store(false, std::memory_order_relaxed);
  // The thread-exit hook hands the buffer back; without it the buffer stays with the thread.
  if (exit_key_ok_) pthread_setspecific(exit_key_, b);
  return b;
}

void TraceRecorder::on_thread_exit(void* buffer) {
  // Runs on the exiting thread. Forget the buffer first: should a later destructor of this thread
  // free CUDA memory, record() attaches a fresh buffer instead of writing into one the writer may
  // already have handed to another thread.
  this_thread_buffer() = BufferSlot{0, nullptr};
  // Everything the thread pushed happens-before this store; the writer drains, then recycles.
  static_cast<ThreadBuffer*>(buffer)->orphaned.store(true, std::memory_order_release);
}

void TraceRecorder::add_device(const DeviceInfo& d) {
  if (!accepting_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(registry_mu_);
  pending_devices_.push_back(d);
}

void TraceRecorder::wake_writer() {
  wake_word_.fetch_add(1, std::memory_order_seq_cst);
  if (writer_sleeping_.load(std::memory_order_seq_cst)) futex(&wake_word_, FUTEX_WAKE_PRIVATE, 1, nullptr);
}

uint64_t TraceRecorder::dropped() const {
  uint64_t n = 0;
  std::lock_guard<std::mutex> lock(registry_mu_);
  for (const auto& b : buffers_) n += b->dropped_total.load(std::memory_order_relaxed);
  return n;
}

size_t TraceRecorder::thread_buffers() const {
  std::lock_guard<std::mutex> lock(registry_mu_);
  return buffers_.size();
}

// ---- the writer ----

void* TraceRecorder::writer_main(void* self) {
  auto* r = static_cast<TraceRecorder*>(self);
  pthread_setname_np(pthread_self(), "gpushim-trace");
  note_own_thread();
  unsigned interval_ms = r->options_.flush_interval_ms;
  for (;;) {
    end_process_if_orphaned();  // throttled: a program whose threads all ended must not live on for this one
    const uint32_t seen = r->wake_word_.load(std::memory_order_seq_cst);
    r->writer_sleeping_.store(true, std::memory_order_seq_cst);
    if (!r->stop_.load(std::memory_order_acquire)) {
      timespec ts{static_cast<time_t>(interval_ms / 1000), static_cast<long>(interval_ms % 1000) * 1000000L};
      futex(&r->wake_word_, FUTEX_WAIT_PRIVATE, seen, &ts);
    }
    r->writer_sleeping_.store(false, std::memory_order_seq_cst);
    if (r->stop_.load(std::memory_order_acquire)) break;
    std::lock_guard<std::mutex> lock(r->io_mu_);
    if (r->finished_ || r->child_) break;
    const uint64_t before = r->written_.load(std::memory_order_relaxed);
    r->drain_and_write();
    const bool idle = r->written_.load(std::memory_order_relaxed) == before;
    interval_ms = idle ? std::min(interval_ms * 2, std::max(kMaxIdleIntervalMs, r->options_.flush_interval_ms))
                       : r->options_.flush_interval_ms;
  }
  return nullptr;
}

bool TraceRecorder::write_out(const std::string& bytes) {
  if (io_failed_) return false;
  struct stat st;
  if (file_known_ && (::fstat(fd_, &st) != 0 || st.st_dev != file_dev_ || st.st_ino != file_ino_)) {
    io_failed_ = true;
    fd_lost_ = true;
    accepting_.store(false, std::memory_order_relaxed);
    log_line("the program closed or replaced descriptor %d of the trace %s; recording stopped (the file stays "
             "readable up to here)", fd_, path_.c_str());
    return false;
  }
  // The header and finish()'s last drain are written from the host's own threads: write_fully
  // makes a file-size limit cost the trace only.
  const int e = write_fully(fd_, bytes.data(), bytes.size());
  if (e == 0) return true;
  io_failed_ = true;
  accepting_.store(false, std::memory_order_relaxed);
  log_line("cannot write the trace %s: %s; recording stopped (the file stays readable up to here)", path_.c_str(),
           std::strerror(e));
  return false;
}

void TraceRecorder::encode_new_stacks(const std::vector<uint32_t>& ids, std::string* out) {
  std::vector<StackInfo> stacks;
  std::vector<PyFrameInfo> pyframes;
  std::vector<uint64_t> words;
  Symbolizer::PythonResolver resolve_python;
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    resolve_python = python_resolver_;
  }
  size_t payload_estimate = 0;
  auto flush_stacks = [&] {
    if (!pyframes.empty()) append_chunk(out, ChunkType::kPyFrames, encode_pyframes(pyframes));
    pyframes.clear();
    const std::vector<ModuleInfo> fresh = modules_.take_new();
    if (!fresh.empty()) append_chunk(out, ChunkType::kModules, encode_modules(fresh));
    if (!stacks.empty()) append_chunk(out, ChunkType::kStacks, encode_stacks(stacks));
    stacks.clear();
    payload_estimate = 0;
  };
  for (uint32_t id : ids) {
    stacks_->frames(id, &words);
    StackInfo s;
    s.id = id;
    s.frames.reserve(words.size());
    for (uint64_t w : words) {
      FrameCode f;
      if (is_python_frame(w)) {
        f.selector = kFramePython;
        f.value = python_frame_id(w);
        FrameInfo fi;
        if (resolve_python && written_pyframes_.insert(python_frame_id(w)).second && resolve_python(python_frame_id(w), &fi))
          pyframes.push_back(PyFrameInfo{python_frame_id(w), fi.function, fi.file, fi.line});
      } else if (const ModuleInfo* m = modules_.find(w, drains_)) {
        f.selector = kFrameModule0 + m->id;
        f.value = w - m->bias;
      } else {
        f.selector = kFrameRaw;
        f.value = w;
      }
      s.frames.push_back(f);
    }
    payload_estimate += 4 + s.frames.size() * 6;
    stacks.push_back(std::move(s));
    if (payload_estimate >= kChunkTarget) flush_stacks();
  }
  flush_stacks();
}

bool TraceRecorder::drain_and_write() {
  if (io_failed_ || finished_ || child_) return false;
  ++drains_;
  batch_.clear();
  std::vector<ThreadBuffer*> buffers;
  std::vector<DeviceInfo> devices;
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    buffers.reserve(buffers_.size());
    for (const auto& b : buffers_) buffers.push_back(b.get());
    devices.swap(pending_devices_);
  }
  std::vector<ThreadBuffer*> exited;
  for (ThreadBuffer* b : buffers) {
    // True only between its thread's exit and the recycling below (which clears it), so the value
    // read is that exit's store: everything the thread pushed happens-before, and the drain that
    // follows takes all of it. (Left true while idle, as it once was, a stale true from the
    // previous owner let a buffer be recycled while its next thread was still pushing: a TSan
    // report, and that thread's last events lost.)
    const bool orphaned = b->orphaned.load(std::memory_order_acquire);
    b->ring.drain([&](const TraceEvent& e) { batch_.push_back(e); });
    if (orphaned) exited.push_back(b);
  }
  if (!exited.empty()) {
    // Only here does an orphaned buffer become attachable again, so none of these has a producer.
    std::lock_guard<std::mutex> lock(registry_mu_);
    for (ThreadBuffer* b : exited) {
      b->ring.reset();
      b->pending_drops = 0;
      b->orphaned.store(false, std::memory_order_relaxed);
      idle_buffers_.push_back(b);
    }
  }
  out_.clear();
  for (const DeviceInfo& d : devices) append_chunk(&out_, ChunkType::kDevice, encode_device(d));
  if (batch_.empty()) return out_.empty() || write_out(out_);

  // Rings are each in time order; the file is too, so deltas stay small and readers can stream.
  std::stable_sort(batch_.begin(), batch_.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.t_ns < b.t_ns; });
  std::vector<uint32_t> new_stacks;
  for (const TraceEvent& e : batch_)
    if ((e.kind == EventKind::kAlloc || e.kind == EventKind::kOom) && e.stack != kEmptyStack &&
        written_stacks_.insert(e.stack).second)
      new_stacks.push_back(e.stack);
  if (!new_stacks.empty()) encode_new_stacks(new_stacks, &out_);

  size_t i = 0;
  while (i < batch_.size()) {
    std::string payload;
    EventEncoder enc(&payload);
    for (; i < batch_.size() && enc.bytes() < kChunkTarget; ++i) enc.add(batch_[i]);
    enc.finish();
    append_chunk(&out_, ChunkType::kEvents, payload);
    if (out_.size() >= kWriteTarget) {
      if (!write_out(out_)) return false;
      out_.clear();
    }
  }
  if (!out_.empty() && !write_out(out_)) return false;
  written_.fetch_add(batch_.size(), std::memory_order_relaxed);
  return true;
}

void TraceRecorder::flush() {
  std::lock_guard<std::mutex> lock(io_mu_);
  drain_and_write();
}

void TraceRecorder::finish(EndInfo end) {
  accepting_.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (finished_ || child_) return;
    drain_and_write();
    if (!io_failed_) {
      end.events_written = written_.load(std::memory_order_relaxed);
      end.events_dropped = dropped();
      std::string tail;
      append_chunk(&tail, ChunkType::kEnd, encode_end(end));
      write_out(tail);
    }
    if (!fd_lost_) ::close(fd_);
    finished_ = true;
  }
  wake_writer();  // it sees finished_ and exits
  // Joined, not left finished and unjoined for the rest of the process (TSan reports that as a
  // leaked thread): once woken it only takes io_mu_, free now, and returns.
  if (writer_started_) {
    if (!pthread_equal(writer_, pthread_self())) pthread_join(writer_, nullptr);  // see ~TraceRecorder
    writer_started_ = false;
  }
}

void TraceRecorder::disable_in_child() {
  // No lock: a thread of the parent may have held one at fork. Nothing here writes to the file.
  accepting_.store(false, std::memory_order_relaxed);
  child_ = true;
  writer_started_ = false;  // the writer thread does not exist in the child
}

}  // namespace gpushim::trace
