// The shim's own list of contexts the program destroyed (cuda/destroyed_contexts.h): what a real
// driver does not say under a context another thread destroyed (an H200, run 8).
#include "cuda/destroyed_contexts.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace gpushim {
namespace {

CUcontext fake_context(uintptr_t n) { return reinterpret_cast<CUcontext>(0x7d0000000000 + n * 0x1000); }

TEST(DestroyedContexts, ListedUntilAContextIsMadeWithTheHandle) {
  const CUcontext a = fake_context(1), b = fake_context(2);
  EXPECT_FALSE(context_destroyed(a));
  EXPECT_TRUE(note_context_destroying(a));
  EXPECT_FALSE(note_context_destroying(a));  // listed once
  EXPECT_TRUE(context_destroyed(a));
  EXPECT_FALSE(context_destroyed(b));
  EXPECT_FALSE(context_destroyed(nullptr));
  note_context_alive(a);  // the driver gave a new context its handle
  EXPECT_FALSE(context_destroyed(a));
}

TEST(DestroyedContexts, ReusedHandlesDoNotPushOutAnOldDestroyedOne) {
  // A review's reproducer: one context destroyed, then hundreds of destroy/make rounds on another
  // handle. Freed slots are used again, so the first stays listed.
  const CUcontext kept = fake_context(10), churned = fake_context(11);
  ASSERT_TRUE(note_context_destroying(kept));
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(note_context_destroying(churned));
    note_context_alive(churned);
  }
  EXPECT_TRUE(context_destroyed(kept));
  note_context_alive(kept);
  EXPECT_FALSE(context_destroyed(kept));
}

TEST(DestroyedContexts, WhenEverySlotIsInUseTheOldestIsForgotten) {
  constexpr uintptr_t kMany = 200;
  for (uintptr_t i = 0; i < kMany; ++i) ASSERT_TRUE(note_context_destroying(fake_context(100 + i)));
  EXPECT_FALSE(context_destroyed(fake_context(100)));        // forgotten: the driver's refusal tells then
  EXPECT_TRUE(context_destroyed(fake_context(100 + kMany - 1)));  // the latest kept
  for (uintptr_t i = 0; i < kMany; ++i) note_context_alive(fake_context(100 + i));
  for (uintptr_t i = 0; i < kMany; ++i) EXPECT_FALSE(context_destroyed(fake_context(100 + i))) << i;
}

TEST(DestroyedContexts, EvictionTakesTheOneListedLongestAgo) {
  // A review's reproducer: slots freed and used again made a round-robin eviction drop the newest.
  constexpr uintptr_t kFull = 64;
  for (uintptr_t i = 0; i < kFull; ++i) ASSERT_TRUE(note_context_destroying(fake_context(300 + i)));
  ASSERT_TRUE(note_context_destroying(fake_context(300 + kFull)));  // evicts 300
  note_context_alive(fake_context(301));                             // frees a slot
  ASSERT_TRUE(note_context_destroying(fake_context(400)));           // into that slot
  ASSERT_TRUE(note_context_destroying(fake_context(401)));           // evicts 302, the oldest left
  EXPECT_TRUE(context_destroyed(fake_context(400)));
  EXPECT_TRUE(context_destroyed(fake_context(401)));
  EXPECT_FALSE(context_destroyed(fake_context(302)));
  EXPECT_TRUE(context_destroyed(fake_context(303)));
  for (uintptr_t i = 0; i <= kFull; ++i) note_context_alive(fake_context(300 + i));
  note_context_alive(fake_context(400));
  note_context_alive(fake_context(401));
  EXPECT_FALSE(context_destroyed(fake_context(303)));
}

}  // namespace
}  // namespace gpushim
