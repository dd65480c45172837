// The Python frame walker, object copies and code table, run against interpreter structures built
// by hand in the layouts of python_layout.h: every rule is checked without a real interpreter
// (the e2e tests run the real ones).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "python/python_code_table.h"
#include "python/python_frame_walker.h"
#include "python/python_objects.h"
#include "python/python_runtime.h"

namespace gpushim {
namespace {

// Fake type objects: only their addresses matter.
alignas(8) uint64_t g_code_type[4], g_str_type[4], g_bytes_type[4], g_long_type[4];
std::atomic<uintptr_t> g_tstate{0};
std::atomic<int> g_finalizing{0};
void* fake_this_thread_state() { return reinterpret_cast<void*>(g_tstate.load()); }
int fake_is_finalizing() { return g_finalizing.load(); }

// Zeroed, 8-byte aligned blocks that live as long as the test.
class Heap {
 public:
  uintptr_t alloc(size_t bytes) {
    blocks_.emplace_back(new uint64_t[(bytes + 7) / 8 + 1]());
    return reinterpret_cast<uintptr_t>(blocks_.back().get());
  }
  template <typename T>
  static T get(uintptr_t addr) {
    T v;
    std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof(T));
    return v;
  }
  template <typename T>
  static void put(uintptr_t addr, T v) {
    std::memcpy(reinterpret_cast<void*>(addr), &v, sizeof(T));
  }

 private:
  std::vector<std::unique_ptr<uint64_t[]>> blocks_;
};

class FakePython {
 public:
  explicit FakePython(int minor) {
    rt.layout = python_layout_for(3, minor);
    rt.version = "3." + std::to_string(minor) + ".0";
    rt.this_thread_state = fake_this_thread_state;
    rt.is_finalizing = fake_is_finalizing;
    rt.code_type = reinterpret_cast<uintptr_t>(g_code_type);
    rt.str_type = reinterpret_cast<uintptr_t>(g_str_type);
    rt.bytes_type = reinterpret_cast<uintptr_t>(g_bytes_type);
    rt.long_type = reinterpret_cast<uintptr_t>(g_long_type);
    const PythonLayout& L = *rt.layout;
    tstate = heap.alloc(256);
    if (L.cframe_current >= 0) {
      cframe = heap.alloc(64);
      Heap::put<uintptr_t>(tstate + L.tstate_frame, cframe);
    }
    g_tstate = tstate;
    g_finalizing = 0;
  }
  ~FakePython() { g_tstate = 0; }

  uintptr_t str(const std::string& ascii) {
    const uintptr_t o = heap.alloc(rt.layout->ascii_size + ascii.size() + 1);
    Heap::put<uintptr_t>(o + kPyObjectType, rt.str_type);
    Heap::put<int64_t>(o + kPyUnicodeLength, static_cast<int64_t>(ascii.size()));
    Heap::put<uint32_t>(o + kPyUnicodeState, (1u << 2) | (1u << 5) | (1u << 6));  // kind 1, compact, ascii
    std::memcpy(reinterpret_cast<void*>(o + rt.layout->ascii_size), ascii.data(), ascii.size());
    return o;
  }
  template <typename Char>
  uintptr_t wide_str(const std::vector<Char>& chars) {
    const uintptr_t o = heap.alloc(rt.layout->compact_size + (chars.size() + 1) * sizeof(Char));
    Heap::put<uintptr_t>(o + kPyObjectType, rt.str_type);
    Heap::put<int64_t>(o + kPyUnicodeLength, static_cast<int64_t>(chars.size()));
    Heap::put<uint32_t>(o + kPyUnicodeState, (static_cast<uint32_t>(sizeof(Char)) << 2) | (1u << 5));
    std::memcpy(reinterpret_cast<void*>(o + rt.layout->compact_size), chars.data(), chars.size() * sizeof(Char));
    return o;
  }
  uintptr_t bytes(const std::string& data) {
    const uintptr_t o = heap.alloc(kPyBytesData + data.size() + 1);
    Heap::put<uintptr_t>(o + kPyObjectType, rt.bytes_type);
    Heap::put<int64_t>(o + kPyVarSize, static_cast<int64_t>(data.size()));
    std::memcpy(reinterpret_cast<void*>(o + kPyBytesData), data.data(), data.size());
    return o;
  }
  uintptr_t code(const std::string& file, const std::string& name, int first_line, const std::string& table,
                 int argcount = 0, int first_traceable = 0) {
    const PythonLayout& L = *rt.layout;
    const uintptr_t c = heap.alloc(512);
    Heap::put<uintptr_t>(c + kPyObjectType, rt.code_type);
    Heap::put<uintptr_t>(c + L.code_filename, str(file));
    Heap::put<uintptr_t>(c + L.code_name, str(name));
    Heap::put<uintptr_t>(c + L.code_linetable, bytes(table));
    Heap::put<int>(c + L.code_firstlineno, first_line);
    Heap::put<int>(c + L.code_argcount, argcount);
    if (L.code_firsttraceable >= 0) Heap::put<int>(c + L.code_firsttraceable, first_traceable);
    return c;
  }
  // A frame running `code` at `offset` bytes; linked below (outside) the current innermost.
  uintptr_t frame(uintptr_t code, int offset, int owner = 0, bool is_entry = false) {
    const PythonLayout& L = *rt.layout;
    const uintptr_t f = heap.alloc(L.frame_localsplus + 64);
    Heap::put<uintptr_t>(f + L.frame_code, code);
    if (L.model == PyFrameModel::kFrameObject) {
      Heap::put<int>(f + L.frame_position, offset < 0 ? -1 : offset / L.lasti_scale);
    } else {
      Heap::put<uintptr_t>(f + L.frame_position, code + L.code_adaptive + offset);
      Heap::put<int8_t>(f + L.frame_owner, static_cast<int8_t>(owner));
      if (L.frame_is_entry >= 0) Heap::put<uint8_t>(f + L.frame_is_entry, is_entry);
    }
    frames.push_back(f);
    relink();
    return f;
  }
  // The C entry frame of an eval call (3.12+).
  uintptr_t cstack_frame() {
    const PythonLayout& L = *rt.layout;
    const uintptr_t f = heap.alloc(L.frame_localsplus + 8);
    Heap::put<int8_t>(f + L.frame_owner, L.owner_cstack);
    frames.push_back(f);
    relink();
    return f;
  }
  // frames[0] is the innermost.
  void relink() {
    const PythonLayout& L = *rt.layout;
    for (size_t i = 0; i < frames.size(); ++i)
      Heap::put<uintptr_t>(frames[i] + L.frame_previous, i + 1 < frames.size() ? frames[i + 1] : 0);
    const uintptr_t head = frames.empty() ? 0 : frames[0];
    if (L.cframe_current >= 0)
      Heap::put<uintptr_t>(cframe + L.cframe_current, head);
    else
      Heap::put<uintptr_t>(tstate + L.tstate_frame, head);
  }
  std::vector<PyFrameRef> walk(size_t max = 64) {
    std::vector<PyFrameRef> out(max);
    out.resize(walk_python_frames(rt, out.data(), max));
    return out;
  }

  Heap heap;
  PythonRuntime rt;
  uintptr_t tstate = 0, cframe = 0;
  std::vector<uintptr_t> frames;
};

// A 3.11+ location table: entry 1 covers code units 0-3 at first_line + 1 (no-column form,
// signed varint 2 = +1); entry 2 covers units 4-7 at one more line (one-line form 11, two column
// bytes); entry 3 covers units 8-9 with no line (form 15).
const std::string kLocations("\xeb\x02\xdb\x00\x04\xf9", 6);

TEST(PythonFrameWalker, ReadsTheChainOf312WithEvalCallBoundaries) {
  FakePython py(12);
  const uintptr_t a = py.code("/x/a.py", "inner", 10, kLocations);
  const uintptr_t b = py.code("/x/b.py", "Model.forward", 20, kLocations);
  const uintptr_t c = py.code("/x/c.py", "<module>", 1, kLocations);
  py.frame(a, 6);
  py.frame(b, 10);
  py.cstack_frame();
  py.frame(c, 2);
  py.cstack_frame();
  const auto f = py.walk();
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].code, a);
  EXPECT_EQ(f[0].byte_offset, 6);
  EXPECT_FALSE(f[0].ends_eval_call);
  EXPECT_EQ(f[1].code, b);
  EXPECT_EQ(f[1].byte_offset, 10);
  EXPECT_TRUE(f[1].ends_eval_call);
  EXPECT_EQ(f[2].code, c);
  EXPECT_TRUE(f[2].ends_eval_call);
  EXPECT_EQ(py.walk(2).size(), 2u);
}

TEST(PythonFrameWalker, Reads311EntryFlagsAndSkipsIncompleteFrames) {
  FakePython py(11);
  const uintptr_t a = py.code("a.py", "a", 1, kLocations, 0, /*first_traceable=*/2);
  py.frame(a, 4);                       // complete (at RESUME)
  py.frame(a, 0);                       // still in its prologue: invisible, like in tracebacks
  py.frame(a, 0, /*owner=*/1);          // a generator's frame is never incomplete
  py.frame(a, 8, 0, /*is_entry=*/true);
  py.frame(a, 4, 0, /*is_entry=*/true);
  const auto f = py.walk();
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].byte_offset, 4);
  EXPECT_EQ(f[1].byte_offset, 0);
  EXPECT_FALSE(f[1].ends_eval_call);
  EXPECT_EQ(f[2].byte_offset, 8);
  EXPECT_TRUE(f[2].ends_eval_call);
  EXPECT_TRUE(f[3].ends_eval_call);
}

TEST(PythonFrameWalker, ReadsFrameObjectsOf39And310) {
  for (int minor : {9, 10}) {
    FakePython py(minor);
    const uintptr_t a = py.code("a.py", "f", 1, "");
    py.frame(a, 12);
    py.frame(a, -1);  // not started yet
    const auto f = py.walk();
    ASSERT_EQ(f.size(), 2u) << minor;
    EXPECT_EQ(f[0].byte_offset, 12) << minor;  // 3.10 keeps an instruction index: scaled back to bytes
    EXPECT_EQ(f[1].byte_offset, -1);
    EXPECT_TRUE(f[0].ends_eval_call);  // one native eval call per frame before 3.11
    EXPECT_TRUE(f[1].ends_eval_call);
  }
}

TEST(PythonFrameWalker, NothingWithoutThreadStateOrFramesOrWhileFinalizing) {
  FakePython py(13);
  EXPECT_TRUE(py.walk().empty());  // a thread state without frames
  py.frame(py.code("a.py", "f", 1, kLocations), 0);
  EXPECT_EQ(py.walk().size(), 1u);
  g_finalizing = 1;
  EXPECT_TRUE(py.walk().empty());
  g_finalizing = 0;
  g_tstate = 0;  // a thread Python never saw
  EXPECT_TRUE(py.walk().empty());
}

TEST(PythonFrameWalker, StopsAtAFrameThatDoesNotHoldACodeObject) {
  FakePython py(13);
  const uintptr_t a = py.code("a.py", "f", 1, kLocations);
  py.frame(a, 0);
  const uintptr_t bogus = py.heap.alloc(64);  // an object of another type
  py.frame(bogus, 0);
  py.frame(a, 2);
  EXPECT_EQ(py.walk().size(), 1u);
  // A cycle ends at the step limit instead of looping.
  FakePython loop(13);
  loop.frame(a, 0);
  Heap::put<uintptr_t>(loop.frames[0] + loop.rt.layout->frame_previous, loop.frames[0]);
  EXPECT_EQ(loop.walk(10000).size(), 4096u);
}

TEST(PythonFrameWalker, ReadsPositionalArguments) {
  FakePython py(12);
  const uintptr_t a = py.code("a.py", "step", 1, kLocations, /*argcount=*/2);
  const uintptr_t f = py.frame(a, 0);
  const uintptr_t obj = py.heap.alloc(32), number = py.heap.alloc(32);  // an object; an int
  Heap::put<uintptr_t>(number + kPyObjectType, py.rt.long_type);
  Heap::put<uint64_t>(number + 16, 1);      // size (3.12: tag) word
  Heap::put<uint32_t>(number + 24, 1000);   // first digit
  Heap::put<uintptr_t>(f + py.rt.layout->frame_localsplus, obj);
  Heap::put<uintptr_t>(f + py.rt.layout->frame_localsplus + 8, number);
  const auto frames = py.walk();
  uintptr_t args[4] = {};
  ASSERT_EQ(read_python_arguments(py.rt, frames[0], args, 4), 2u);
  EXPECT_EQ(args[0], obj);  // compared by identity
  // An int at the same address with another value is another argument (a temporary's reused
  // address: train_step(1000 + j)); the same value is the same argument.
  const uintptr_t first = args[1];
  EXPECT_NE(first, number);
  Heap::put<uint32_t>(number + 24, 1001);
  read_python_arguments(py.rt, frames[0], args, 4);
  EXPECT_NE(args[1], first);
  Heap::put<uint32_t>(number + 24, 1000);
  read_python_arguments(py.rt, frames[0], args, 4);
  EXPECT_EQ(args[1], first);
}

TEST(PythonObjects, CopiesEveryCompactStringKindAsUtf8) {
  FakePython py(12);
  std::string out;
  EXPECT_TRUE(copy_python_str(py.rt, py.str("train.py"), 100, &out));
  EXPECT_EQ(out, "train.py");
  EXPECT_TRUE(copy_python_str(py.rt, py.wide_str<uint8_t>({'c', 0xE9}), 100, &out));  // latin-1
  EXPECT_EQ(out, "c\xC3\xA9");
  EXPECT_TRUE(copy_python_str(py.rt, py.wide_str<uint16_t>({0x4E2D, 0xD800}), 100, &out));  // lone surrogate
  EXPECT_EQ(out, "\xE4\xB8\xAD\xEF\xBF\xBD");
  EXPECT_TRUE(copy_python_str(py.rt, py.wide_str<uint32_t>({0x1F600}), 100, &out));
  EXPECT_EQ(out, "\xF0\x9F\x98\x80");
  EXPECT_TRUE(copy_python_str(py.rt, py.str("abcdef"), 3, &out));
  EXPECT_EQ(out, "abc");
  EXPECT_FALSE(copy_python_str(py.rt, py.bytes("x"), 100, &out));  // not a str
  EXPECT_EQ(out, "?");
  EXPECT_FALSE(copy_python_str(py.rt, 0, 100, &out));
  const uintptr_t legacy = py.str("x");
  Heap::put<uint32_t>(legacy + kPyUnicodeState, 1u << 2);  // not compact
  EXPECT_FALSE(copy_python_str(py.rt, legacy, 100, &out));
  EXPECT_TRUE(copy_python_bytes(py.rt, py.bytes(std::string("\x00\x01", 2)), 100, &out));
  EXPECT_EQ(out, std::string("\x00\x01", 2));
  EXPECT_FALSE(copy_python_bytes(py.rt, py.str("x"), 100, &out));
}

TEST(PythonCodeTable, InternsLocationsAndResolvesThemLater) {
  FakePython py(12);
  PythonCodeTable table(py.rt, "");
  const uintptr_t a = py.code("/src/train.py", "Trainer.step", 40, kLocations);
  bool site = true;
  const uint32_t first = table.location(a, 0, &site);
  EXPECT_FALSE(site);
  EXPECT_EQ(table.location(a, 0, &site), first);
  const uint32_t second = table.location(a, 8, &site);
  const uint32_t third = table.location(a, 16, &site);
  EXPECT_NE(first, second);
  EXPECT_NE(second, third);
  EXPECT_EQ(table.locations(), 3u);
  PythonLocation f;
  ASSERT_TRUE(table.resolve(first, &f));
  EXPECT_EQ(f.function, "Trainer.step");
  EXPECT_EQ(f.file, "/src/train.py");
  EXPECT_EQ(f.line, 41);
  ASSERT_TRUE(table.resolve(second, &f));
  EXPECT_EQ(f.line, 42);
  ASSERT_TRUE(table.resolve(third, &f));
  EXPECT_EQ(f.line, 0);  // no line for that instruction
  EXPECT_FALSE(table.resolve(12345, &f));
  ASSERT_TRUE(table.resolve(PythonCodeTable::kTableFullId, &f));
  EXPECT_NE(f.function.find("full"), std::string::npos);
}

TEST(PythonCodeTable, ACodeObjectReusingAFreedOnesAddressGetsNewIds) {
  FakePython py(12);
  PythonCodeTable table(py.rt, "");
  const uintptr_t a = py.code("old.py", "old", 10, kLocations);
  bool site = false;
  const uint32_t old_id = table.location(a, 0, &site);
  // The old code object is freed and another takes its address: its names and table differ.
  Heap::put<uintptr_t>(a + py.rt.layout->code_filename, py.str("new.py"));
  Heap::put<uintptr_t>(a + py.rt.layout->code_name, py.str("new"));
  const uint32_t new_id = table.location(a, 0, &site);
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(table.location(a, 0, &site), new_id);
  PythonLocation f;
  ASSERT_TRUE(table.resolve(old_id, &f));
  EXPECT_EQ(f.function, "old");  // stacks recorded earlier keep their meaning
  ASSERT_TRUE(table.resolve(new_id, &f));
  EXPECT_EQ(f.function, "new");
  EXPECT_EQ(f.file, "new.py");
}

// What compile() in a loop does: the old code object, its file name and its line table are freed
// together, and the next snippet's take the same three addresses with other contents. 3.12+ give
// the new code object the interpreter's next co_version.
TEST(PythonCodeTable, ACodeObjectReusingEveryAddressOfAFreedOneGetsNewIds) {
  for (int minor : {12, 13}) {
    SCOPED_TRACE(minor);
    FakePython py(minor);
    const PythonLayout& L = *py.rt.layout;
    PythonCodeTable table(py.rt, "");
    const uintptr_t a = py.code("<cell-1>", "<module>", 1, kLocations);
    Heap::put<uint32_t>(a + L.code_version, 900);
    bool site = false;
    const uint32_t old_id = table.location(a, 8, &site);
    EXPECT_EQ(table.location(a, 8, &site), old_id);
    // The new snippet: same addresses; its file is named otherwise and its line table says line 4
    // where the old one said 3.
    std::memcpy(reinterpret_cast<char*>(Heap::get<uintptr_t>(a + L.code_filename) + L.ascii_size), "<cell-2>", 8);
    Heap::put<uint8_t>(Heap::get<uintptr_t>(a + L.code_linetable) + kPyBytesData + 2, 0x80 | (12 << 3) | 3);
    Heap::put<uint32_t>(a + L.code_version, 901);
    const uint32_t new_id = table.location(a, 8, &site);
    EXPECT_NE(new_id, old_id);
    EXPECT_EQ(table.location(a, 8, &site), new_id);
    PythonLocation f;
    ASSERT_TRUE(table.resolve(old_id, &f));
    EXPECT_EQ(f.file, "<cell-1>");
    EXPECT_EQ(f.line, 3);
    ASSERT_TRUE(table.resolve(new_id, &f));
    EXPECT_EQ(f.file, "<cell-2>");
    EXPECT_EQ(f.line, 4);
  }
}

TEST(PythonCodeTable, MarksTheIterationSiteByNameOrQualifiedName) {
  FakePython py(12);
  PythonCodeTable table(py.rt, "step");
  bool site = false;
  table.location(py.code("a.py", "Trainer.step", 1, kLocations), 0, &site);
  EXPECT_TRUE(site);
  table.location(py.code("a.py", "main.<locals>.step", 1, kLocations), 0, &site);
  EXPECT_TRUE(site);
  table.location(py.code("a.py", "step", 1, kLocations), 0, &site);
  EXPECT_TRUE(site);
  table.location(py.code("a.py", "first_step", 1, kLocations), 0, &site);
  EXPECT_FALSE(site);
  table.location(py.code("a.py", "step.inner", 1, kLocations), 0, &site);
  EXPECT_FALSE(site);
  PythonCodeTable qualified(py.rt, "Trainer.step");
  qualified.location(py.code("a.py", "Trainer.step", 1, kLocations), 0, &site);
  EXPECT_TRUE(site);
  qualified.location(py.code("a.py", "Other.step", 1, kLocations), 0, &site);
  EXPECT_FALSE(site);
}

TEST(PythonCodeTable, GrowsAndStaysConsistentUnderConcurrentLookups) {
  FakePython py(12);
  PythonCodeTable table(py.rt, "");
  std::vector<uintptr_t> codes;
  for (int i = 0; i < 40; ++i) codes.push_back(py.code("f" + std::to_string(i) + ".py", "fn", i + 1, kLocations));
  constexpr int kOffsets = 200;  // 8000 locations: the table grows several times while in use
  constexpr int kThreads = 4;
  const size_t n = codes.size() * kOffsets;  // 8000 = 2^6 * 5^3
  std::vector<std::vector<uint32_t>> ids(kThreads, std::vector<uint32_t>(n));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Each thread visits every location, in its own order (strides coprime with n).
      static constexpr size_t kStrides[] = {7919, 7919 * 3, 7919 * 7, 7919 * 9};
      const size_t stride = kStrides[t];
      bool site = false;
      for (size_t i = 0; i < n; ++i) {
        const size_t k = (i * stride) % n;
        ids[t][k] = table.location(codes[k / kOffsets], static_cast<int>(k % kOffsets) * 2, &site);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(table.locations(), n);
  bool site = false;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t id = table.location(codes[k / kOffsets], static_cast<int>(k % kOffsets) * 2, &site);
    for (int t = 0; t < kThreads; ++t) ASSERT_EQ(ids[t][k], id) << k;
    PythonLocation f;
    ASSERT_TRUE(table.resolve(id, &f));
    ASSERT_EQ(f.file, "f" + std::to_string(k / kOffsets) + ".py");
  }
  EXPECT_GT(table.memory_bytes(), codes.size() * kOffsets * 16);
}

}  // namespace
}  // namespace gpushim
