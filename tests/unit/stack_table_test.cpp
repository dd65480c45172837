#include "stacks/stack_table.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace gpushim {
namespace {

std::vector<uint64_t> Frames(const StackTable& t, StackId id) {
  std::vector<uint64_t> out;
  t.frames(id, &out);
  return out;
}

TEST(StackTable, EmptyStackIsIdZero) {
  StackTable t;
  EXPECT_EQ(t.intern(nullptr, 0), kEmptyStack);
  uint64_t w = 1;
  EXPECT_EQ(t.intern(&w, 0), kEmptyStack);
  EXPECT_TRUE(Frames(t, kEmptyStack).empty());
  EXPECT_EQ(t.size(), 1u);
}

TEST(StackTable, InterningDeduplicates) {
  StackTable t;
  const std::vector<uint64_t> a = {0x1000, 0x2000, 0x3000};
  const std::vector<uint64_t> a_copy = a;  // equal contents at another address
  const StackId id1 = t.intern(a.data(), a.size());
  const StackId id2 = t.intern(a_copy.data(), a_copy.size());
  EXPECT_NE(id1, kEmptyStack);
  EXPECT_EQ(id1, id2);
  EXPECT_EQ(t.size(), 2u);
}

TEST(StackTable, DistinctStacksGetDistinctIds) {
  StackTable t;
  const std::vector<std::vector<uint64_t>> stacks = {
      {1, 2, 3}, {1, 2}, {1, 2, 3, 4}, {3, 2, 1}, {2}, {1, 2, 4}, {0}, {0, 0},
  };
  std::vector<StackId> ids;
  for (const auto& s : stacks) ids.push_back(t.intern(s.data(), s.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_NE(ids[i], kEmptyStack);
    for (size_t j = i + 1; j < ids.size(); ++j) EXPECT_NE(ids[i], ids[j]) << i << " vs " << j;
  }
  EXPECT_EQ(t.size(), stacks.size() + 1);
}

TEST(StackTable, FramesRoundTrip) {
  StackTable t;
  std::vector<std::vector<uint64_t>> stacks;
  for (uint64_t n = 1; n <= 64; ++n) {
    std::vector<uint64_t> s;
    for (uint64_t k = 0; k < n; ++k) s.push_back(0x400000 + n * 0x100 + k);
    stacks.push_back(s);
  }
  std::vector<StackId> ids;
  for (const auto& s : stacks) ids.push_back(t.intern(s.data(), s.size()));
  for (size_t i = 0; i < stacks.size(); ++i) EXPECT_EQ(Frames(t, ids[i]), stacks[i]);
  EXPECT_GT(t.memory_bytes(), 0u);
}

TEST(StackTable, UnknownIdGivesEmptyStack) {
  StackTable t;
  const uint64_t w[] = {7, 8};
  t.intern(w, 2);
  EXPECT_TRUE(Frames(t, 0xFFFFFFF0u).empty());
  std::vector<uint64_t> out = {1, 2, 3};
  t.frames(0xFFFFFFF0u, &out);
  EXPECT_TRUE(out.empty()) << "output must be cleared";
}

TEST(StackTable, PythonTaggedWordsRoundTrip) {
  EXPECT_TRUE(is_python_frame(make_python_frame(0)));
  EXPECT_TRUE(is_python_frame(make_python_frame(0xFFFFFFFFu)));
  EXPECT_FALSE(is_python_frame(0x7fff12345678ull));
  EXPECT_EQ(python_frame_id(make_python_frame(12345)), 12345u);
  EXPECT_EQ(python_frame_id(make_python_frame(0xFFFFFFFFu)), 0xFFFFFFFFu);

  StackTable t;
  // Mixed stack: native frames under Python frames, as the Python capture produces.
  const std::vector<uint64_t> mixed = {0x7f0000001000, make_python_frame(3), make_python_frame(1), 0x555500000010};
  const std::vector<uint64_t> native_only = {0x7f0000001000, 3, 1, 0x555500000010};
  const StackId a = t.intern(mixed.data(), mixed.size());
  const StackId b = t.intern(native_only.data(), native_only.size());
  EXPECT_NE(a, b) << "the tag must take part in identity";
  const auto back = Frames(t, a);
  ASSERT_EQ(back, mixed);
  EXPECT_FALSE(is_python_frame(back[0]));
  EXPECT_TRUE(is_python_frame(back[1]));
  EXPECT_EQ(python_frame_id(back[1]), 3u);
  EXPECT_EQ(python_frame_id(back[2]), 1u);
}

TEST(StackTable, ConcurrentInterningGivesConsistentIds) {
  StackTable t;
  constexpr int kThreads = 8;
  constexpr int kStacks = 2000;
  // Every thread interns the same set of stacks, in a thread-specific order and with half of them
  // overlapping between neighbours, so equal stacks race to be inserted first.
  auto make_stack = [](int i) {
    std::vector<uint64_t> s;
    for (int k = 0; k <= i % 17; ++k) s.push_back(0x10000ull * static_cast<uint64_t>(i + 1) + static_cast<uint64_t>(k));
    if (i % 5 == 0) s.push_back(make_python_frame(static_cast<uint32_t>(i)));
    return s;
  };
  std::vector<std::vector<StackId>> ids(kThreads, std::vector<StackId>(kStacks));
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int n = 0; n < kStacks; ++n) {
        const int i = (n * 7 + th * 250) % kStacks;
        const auto s = make_stack(i);
        ids[th][i] = t.intern(s.data(), s.size());
      }
    });
  }
  for (auto& th : threads) th.join();

  for (int i = 0; i < kStacks; ++i) {
    for (int th = 1; th < kThreads; ++th) ASSERT_EQ(ids[th][i], ids[0][i]) << "stack " << i;
    ASSERT_EQ(Frames(t, ids[0][i]), make_stack(i));
  }
  EXPECT_EQ(t.size(), static_cast<size_t>(kStacks) + 1);
}

}  // namespace
}  // namespace gpushim
