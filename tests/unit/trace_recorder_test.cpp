// The trace recorder: many threads, thread exit, a disk that cannot keep up, fork, and stacks
// written before the events that use them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "offline_symbolizer.h"
#include "run_view.h"
#include "stacks/stack_table.h"
#include "trace/trace_recorder.h"
#include "trace_reader.h"

namespace gpushim::trace {
namespace {

using analysis::parse_trace;
using analysis::TraceData;

class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/gpushim-trace-test-XXXXXX";
    fd_ = mkstemp(tmpl);
    path_ = tmpl;
  }
  ~TempFile() { unlink(path_.c_str()); }
  int take_fd() { return fd_; }  // the recorder owns and closes it
  const std::string& path() const { return path_; }
  TraceData read() const {
    std::string bytes, err;
    EXPECT_TRUE(analysis::read_file(path_, &bytes, &err)) << err;
    TraceData t;
    EXPECT_TRUE(parse_trace(bytes, &t, &err)) << err;
    return t;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

HeaderInfo header() {
  HeaderInfo h;
  h.pid = static_cast<int>(getpid());
  h.exe = "trace_recorder_test";
  h.policy = "caching";
  h.start_mono_ns = 1;
  return h;
}

TraceEvent alloc_event(uint64_t t, uint64_t addr, uint64_t size, int16_t device = 0) {
  TraceEvent e;
  e.t_ns = t;
  e.addr = addr;
  e.size = e.requested = size;
  e.device = device;
  e.kind = EventKind::kAlloc;
  return e;
}

TEST(TraceRecorder, EveryEventOfManyThreadsArrivesInOrder) {
  TempFile f;
  StackTable stacks;
  RecorderOptions opt;
  opt.ring_events = 1 << 16;  // large enough that nothing can be dropped here
  auto rec = TraceRecorder::start(f.take_fd(), f.path(), header(), &stacks, opt);
  ASSERT_NE(rec, nullptr);
  constexpr int kThreads = 4, kPerThread = 20000;
  std::atomic<uint64_t> clock{1000};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        // Address encodes (thread, index) so the reader's order can be checked per thread.
        const uint64_t addr = (static_cast<uint64_t>(th + 1) << 40) | static_cast<uint64_t>(i) << 9;
        rec->record(alloc_event(clock.fetch_add(1), addr, 512, static_cast<int16_t>(th % 2)));
      }
    });
  }
  for (auto& t : threads) t.join();
  rec->finish(EndInfo{});
  EXPECT_EQ(rec->dropped(), 0u);
  const TraceData t = f.read();
  EXPECT_FALSE(t.truncated) << t.stop_reason;
  ASSERT_TRUE(t.end.has_value());
  EXPECT_EQ(t.end->events_written, static_cast<uint64_t>(kThreads * kPerThread));
  ASSERT_EQ(t.events.size(), static_cast<size_t>(kThreads * kPerThread));
  std::vector<int64_t> last(kThreads, -1);
  for (const TraceEvent& e : t.events) {
    const int th = static_cast<int>(e.addr >> 40) - 1;
    const int64_t i = static_cast<int64_t>((e.addr & ((1ull << 40) - 1)) >> 9);
    ASSERT_GE(th, 0);
    ASSERT_LT(th, kThreads);
    EXPECT_EQ(i, last[th] + 1) << "thread " << th;
    last[th] = i;
    EXPECT_EQ(e.device, th % 2);
  }
}

TEST(TraceRecorder, ThreadsThatExitHandTheirBuffersOn) {
  TempFile f;
  StackTable stacks;
  auto rec = TraceRecorder::start(f.take_fd(), f.path(), header(), &stacks, RecorderOptions{256, 5});
  ASSERT_NE(rec, nullptr);
  constexpr int kThreads = 40;
  for (int th = 0; th < kThreads; ++th) {
    std::thread([&, th] {
      for (int i = 0; i < 10; ++i) rec->record(alloc_event(1000 + th * 10 + i, 0x1000 + (th * 10 + i) * 512, 512));
    }).join();
    if (th % 8 == 7) rec->flush();  // lets the writer recycle the exited threads' buffers
  }
  rec->finish(EndInfo{});
  EXPECT_LE(rec->thread_buffers(), 9u);  // 40 threads, buffers reused after each flush
  EXPECT_EQ(f.read().events.size(), static_cast<size_t>(kThreads * 10));
}

TEST(TraceRecorder, SlowDiskDropsAndCountsInsteadOfGrowing) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  StackTable stacks;
  // Nobody reads the pipe yet: the writer blocks once its 64 KiB buffer is full, and the
  // 1024-event ring is all the memory the recording thread may use.
  auto rec = TraceRecorder::start(pipe_fds[1], "pipe", header(), &stacks, RecorderOptions{1024, 1});
  ASSERT_NE(rec, nullptr);
  constexpr uint64_t kEvents = 200000;
  for (uint64_t i = 0; i < kEvents; ++i) rec->record(alloc_event(1000 + i, 0x100000 + i * 512, 512));
  EXPECT_GT(rec->dropped(), 0u);
  EXPECT_EQ(rec->thread_buffers(), 1u);
  std::string bytes;
  std::thread reader([&] {
    char buf[65536];
    ssize_t n;
    while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) bytes.append(buf, static_cast<size_t>(n));
  });
  rec->flush();  // the disk caught up: everything still buffered is written
  // The next event recorded says where the gap was: a marker carrying the count goes first.
  constexpr uint64_t kLate = 10;
  for (uint64_t i = 0; i < kLate; ++i) rec->record(alloc_event(1'000'000 + i, 0x9000000000 + i * 512, 512));
  rec->finish(EndInfo{});  // closes the write end: the reader sees EOF
  reader.join();
  close(pipe_fds[0]);
  TraceData t;
  std::string err;
  ASSERT_TRUE(parse_trace(bytes, &t, &err)) << err;
  ASSERT_TRUE(t.end.has_value());
  // Every event is either in the file or counted as dropped, and each marker sits exactly at its
  // gap: the next event is the one `count` places after the last one written. (How many gaps
  // there are depends on when the writer thread ran before the pipe filled; under load it can be
  // several.) Events are numbered by their address: 0.. in the first loop, then the late ones.
  auto number = [&](uint64_t addr) {
    return addr >= 0x9000000000u ? kEvents + (addr - 0x9000000000u) / 512 : (addr - 0x100000) / 512;
  };
  uint64_t allocs = 0, marked = 0, pending = 0, gaps = 0;
  int64_t last = -1;
  for (const auto& e : t.events) {
    if (e.kind == EventKind::kDropped) {
      marked += e.size;
      pending += e.size;
      ++gaps;
      continue;
    }
    if (e.kind != EventKind::kAlloc) continue;
    ++allocs;
    const uint64_t n = number(e.addr);
    ASSERT_EQ(n, static_cast<uint64_t>(last + 1) + pending) << "event " << n << " after " << last;
    last = static_cast<int64_t>(n);
    pending = 0;
  }
  EXPECT_GT(gaps, 0u);
  EXPECT_EQ(pending, 0u) << "a marker must be followed by the event after its gap";
  EXPECT_EQ(last, static_cast<int64_t>(kEvents + kLate - 1)) << "the late events are all written, last";
  EXPECT_EQ(allocs + t.end->events_dropped, kEvents + kLate);
  EXPECT_EQ(marked, t.end->events_dropped);
  EXPECT_EQ(t.dropped, t.end->events_dropped);
}

TEST(TraceRecorder, ForkChildNeverWritesTheParentsFile) {
  TempFile f;
  StackTable stacks;
  auto rec = TraceRecorder::start(f.take_fd(), f.path(), header(), &stacks);
  ASSERT_NE(rec, nullptr);
  rec->record(alloc_event(1000, 0x1000, 512));
  rec->flush();
  const pid_t child = fork();
  if (child == 0) {
    rec->disable_in_child();
    rec->record(alloc_event(2000, 0x2000, 512));
    rec->finish(EndInfo{});
    _exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  rec->record(alloc_event(3000, 0x3000, 512));
  rec->finish(EndInfo{});
  const TraceData t = f.read();
  EXPECT_FALSE(t.truncated) << t.stop_reason;
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[0].addr, 0x1000u);
  EXPECT_EQ(t.events[1].addr, 0x3000u);
}

TEST(TraceRecorder, FileSizeLimitAtTheLastWriteNeverKillsTheHost) {
  // finish() drains what the writer thread has not written yet from the host's exiting thread,
  // where SIGXFSZ is at the host's disposition (default: terminate). Found with a program that
  // set RLIMIT_FSIZE just above its trace's size, then allocated and exited: killed by SIGXFSZ.
  TempFile f;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);
    StackTable stacks;
    auto rec = TraceRecorder::start(f.take_fd(), f.path(), header(), &stacks);
    if (rec == nullptr) _exit(10);
    rec->flush();
    struct stat st;
    if (stat(f.path().c_str(), &st) != 0) _exit(11);
    const rlim_t limit = static_cast<rlim_t>(st.st_size) + 64;
    struct rlimit small = {limit, limit};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) _exit(12);
    for (uint64_t i = 0; i < 1000; ++i) rec->record(alloc_event(1000 + i, 0x1000 + i * 512, 512));
    rec->finish(EndInfo{});
    sigset_t pending;
    sigpending(&pending);
    _exit(sigismember(&pending, SIGXFSZ) == 0 ? 0 : 13);
  }
  close(f.take_fd());  // the child's recorder had this one
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const TraceData t = f.read();  // what fit stays readable
  EXPECT_TRUE(t.truncated);
}

TEST(TraceRecorder, ADescriptorTheProgramReplacedIsNeverWrittenNorClosed) {
  // A program that closes descriptors it does not know of and opens its own file (or dup2s over
  // ours) hands the trace's number to that file. Found with a Python program that closed the
  // trace's descriptor and opened a file of its own: the next flushes wrote trace chunks into it.
  TempFile f;
  const int fd = f.take_fd();
  StackTable stacks;
  auto rec = TraceRecorder::start(fd, f.path(), header(), &stacks);
  ASSERT_NE(rec, nullptr);
  rec->record(alloc_event(1000, 0x1000, 512));
  rec->flush();
  char tmpl[] = "/tmp/gpushim-trace-victim-XXXXXX";
  const int victim = mkstemp(tmpl);
  ASSERT_GE(victim, 0);
  ASSERT_EQ(dup2(victim, fd), fd);
  close(victim);
  ASSERT_EQ(write(fd, "user data\n", 10), 10);
  for (uint64_t i = 0; i < 100; ++i) rec->record(alloc_event(2000 + i, 0x2000 + i * 512, 512));
  rec->flush();
  rec->finish(EndInfo{});
  EXPECT_NE(fcntl(fd, F_GETFD), -1) << "the program's descriptor was closed";
  close(fd);
  std::string bytes;
  {
    std::ifstream in(tmpl, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  unlink(tmpl);
  EXPECT_EQ(bytes, "user data\n");
  const TraceData t = f.read();  // the trace keeps what it had
  ASSERT_GE(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].addr, 0x1000u);
}

TEST(TraceRecorder, EventsAfterFinishAreIgnoredAndFinishIsIdempotent) {
  TempFile f;
  StackTable stacks;
  auto rec = TraceRecorder::start(f.take_fd(), f.path(), header(), &stacks);
  ASSERT_NE(rec, nullptr);
  rec->record(alloc_event(1000, 0x1000, 512));
  rec->finish(EndInfo{});
  rec->record(alloc_event(2000, 0x2000, 512));
  rec->finish(EndInfo{});
  const TraceData t = f.read();
  EXPECT_FALSE(t.truncated);
  EXPECT_EQ(t.events.size(), 1u);
}

__attribute__((noinline)) void marker_function_for_stacks() { asm volatile(""); }

TEST(TraceRecorder, StacksAndModulesPrecedeTheirEventsAndSymbolizeOffline) {
  TempFile f;
  StackTable stacks;
  auto rec = TraceRecorder::start(f.take_fd(), f.path(), header(), &stacks);
  ASSERT_NE(rec, nullptr);
  // A "return address" just inside marker_function_for_stacks, as a call from it would leave.
  const uint64_t inside = reinterpret_cast<uint64_t>(&marker_function_for_stacks) + 1;
  const uint64_t words[] = {inside, 0x10, make_python_frame(7)};
  const StackId id = stacks.intern(words, 3);
  TraceEvent e = alloc_event(1000, 0x1000, 512);
  e.stack = id;
  rec->record(e);
  rec->set_python_resolver([](uint32_t pid, FrameInfo* out) {
    out->function = "train_step";
    out->file = "train.py";
    out->line = static_cast<int>(pid) * 6;
    return true;
  });
  rec->finish(EndInfo{});
  const TraceData t = f.read();
  ASSERT_EQ(t.events.size(), 1u);
  ASSERT_EQ(t.stacks.count(id), 1u);
  const auto& codes = t.stacks.at(id);
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_GE(codes[0].selector, kFrameModule0);  // inside this test binary
  EXPECT_EQ(codes[1].selector, kFrameRaw);      // 0x10 is in no module
  EXPECT_EQ(codes[1].value, 0x10u);
  EXPECT_EQ(codes[2].selector, kFramePython);
  analysis::OfflineSymbolizer sym(t);
  const auto& frames = sym.stack(id);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_NE(frames[0].function.find("marker_function_for_stacks"), std::string::npos) << frames[0].function;
  EXPECT_NE(frames[0].file.find("trace_recorder_test.cpp"), std::string::npos) << frames[0].file;
  EXPECT_EQ(frames[0].address, inside);
  EXPECT_TRUE(frames[2].python);
  EXPECT_EQ(frames[2].function, "train_step");
  EXPECT_EQ(frames[2].line, 42);
}

}  // namespace
}  // namespace gpushim::trace
