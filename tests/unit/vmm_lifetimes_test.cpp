#include "policy/vmm_lifetimes.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace gpushim {
namespace {

// Drives VmmLifetimes as the arena does: live user bytes rise at each allocation and fall at each
// free, which is told the block's birth and the live bytes just after it.
struct Live {
  explicit Live(double fall = 0.15, double rise = 0.5) : lifetimes(fall, rise) {}
  struct Block {
    uint64_t born, born_live, size;
  };
  Block alloc(uint64_t size) {
    live += size;
    return {lifetimes.allocated(), live, size};
  }
  void free(const Block& b) {
    lifetimes.freed(b.born, b.born_live, b.size, live);
    live -= b.size;
  }
  VmmLifetimes lifetimes;
  uint64_t live = 0;
};

// A block that lives while live bytes fall well below their level at its birth and rise again
// before its free votes for its size; the block freed into the trough does not.
TEST(VmmLifetimes, ABlockThatLivesThroughATroughVotesForItsSize) {
  Live l;
  auto a = l.alloc(10);
  auto g = l.alloc(1);
  l.free(a);  // the trough: 1 byte live
  EXPECT_FALSE(l.lifetimes.any_votes());
  auto b = l.alloc(10);
  l.free(g);  // g lived through the trough
  EXPECT_TRUE(l.lifetimes.any_votes());
  EXPECT_TRUE(l.lifetimes.outlives_troughs(1));
  l.free(b);  // born after the trough, freed into the next one: votes against 10, never voted for
  EXPECT_FALSE(l.lifetimes.outlives_troughs(10));
}

// Live bytes falling to a block's own size is no trough: the last of a run of frees sees that.
TEST(VmmLifetimes, AFallWithoutARiseIsNoTrough) {
  Live l;
  auto x = l.alloc(10);
  auto y = l.alloc(1);
  l.free(x);
  l.free(y);
  EXPECT_FALSE(l.lifetimes.any_votes());
}

// Votes are kept within -2..2: a size follows its last two lifetimes.
TEST(VmmLifetimes, ASizeFollowsItsLastTwoLifetimes) {
  Live l;
  auto through = [&](int times) {
    for (int i = 0; i < times; ++i) {
      auto big = l.alloc(100);
      auto g = l.alloc(7);
      l.free(big);
      auto again = l.alloc(100);
      l.free(g);
      l.free(again);
    }
  };
  auto short_lived = [&](int times) {
    auto base = l.alloc(100);
    for (int i = 0; i < times; ++i) l.free(l.alloc(7));
    l.free(base);
  };
  through(3);  // +1, +2, capped at +2
  EXPECT_TRUE(l.lifetimes.outlives_troughs(7));
  short_lived(1);  // +1
  EXPECT_TRUE(l.lifetimes.outlives_troughs(7));
  short_lived(1);  // 0
  EXPECT_FALSE(l.lifetimes.outlives_troughs(7));
  short_lived(5);  // capped at -2: two troughs bring it back to 0, a third above
  through(2);
  EXPECT_FALSE(l.lifetimes.outlives_troughs(7));
  through(1);
  EXPECT_TRUE(l.lifetimes.outlives_troughs(7));
}

TEST(VmmLifetimes, FallZeroLearnsNothing) {
  Live l(0, 0.5);
  auto a = l.alloc(10);
  auto g = l.alloc(1);
  l.free(a);
  auto b = l.alloc(10);
  l.free(g);
  l.free(b);
  EXPECT_FALSE(l.lifetimes.any_votes());
  EXPECT_EQ(l.lifetimes.host_bytes(), 0u);
}

}  // namespace
}  // namespace gpushim
