// The virtual-memory API's lifetimes: memory lives until every reference is released and every
// mapping is gone, in either order.
#include "accounting/vmm_tracker.h"

#include <gtest/gtest.h>
#include "test_sizes.h"

namespace gpushim {
namespace {


VmmTracker::Physical device_chunk(uint64_t handle, uint64_t size) {
  return VmmTracker::Physical{handle, size, 0, MemoryKind::kDevice};
}

TEST(VmmTracker, ReleaseWhileMappedWaitsForTheUnmap) {
  VmmTracker t;
  VmmTracker::Physical gone;
  t.created(device_chunk(1, 2 * MiB));
  EXPECT_FALSE(t.mapped(0x10000000, 2 * MiB, 1, &gone));
  EXPECT_FALSE(t.released(1, &gone));  // still mapped: alive
  std::vector<VmmTracker::Physical> out;
  t.unmapped(0x10000000, 2 * MiB, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].handle, 1u);
  EXPECT_EQ(out[0].size, 2 * MiB);
}

TEST(VmmTracker, UnmapThenReleaseEndsAtTheRelease) {
  VmmTracker t;
  VmmTracker::Physical gone;
  t.created(device_chunk(2, 4 * MiB));
  t.mapped(0x20000000, 4 * MiB, 2, &gone);
  std::vector<VmmTracker::Physical> out;
  t.unmapped(0x20000000, 4 * MiB, &out);
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(t.released(2, &gone));
  EXPECT_EQ(gone.size, 4 * MiB);
  EXPECT_FALSE(t.released(2, &gone));  // unknown now: a second release is CUDA's error, not ours
}

TEST(VmmTracker, RetainAddsAReference) {
  VmmTracker t;
  VmmTracker::Physical gone;
  t.created(device_chunk(3, 2 * MiB));
  t.retained(3);
  EXPECT_FALSE(t.released(3, &gone));
  EXPECT_TRUE(t.released(3, &gone));
}

TEST(VmmTracker, OneUnmapCanEndSeveralMappings) {
  VmmTracker t;
  VmmTracker::Physical gone;
  t.created(device_chunk(4, 2 * MiB));
  t.created(device_chunk(5, 2 * MiB));
  t.mapped(0x30000000, 2 * MiB, 4, &gone);
  t.mapped(0x30200000, 2 * MiB, 4, &gone);  // the same memory twice
  t.mapped(0x30400000, 2 * MiB, 5, &gone);
  EXPECT_FALSE(t.released(4, &gone));
  EXPECT_FALSE(t.released(5, &gone));
  std::vector<VmmTracker::Physical> out;
  t.unmapped(0x30000000, 2 * MiB, &out);
  EXPECT_TRUE(out.empty());  // handle 4 has a second mapping
  t.unmapped(0x30200000, 4 * MiB, &out);
  ASSERT_EQ(out.size(), 2u);
}

TEST(VmmTracker, ImportedMemoryIsSizedByItsFirstMapping) {
  VmmTracker t;
  VmmTracker::Physical sized;
  t.imported(6, 0);
  ASSERT_TRUE(t.mapped(0x40000000, 8 * MiB, 6, &sized));
  EXPECT_EQ(sized.size, 8 * MiB);
  EXPECT_EQ(sized.kind, MemoryKind::kImported);
  EXPECT_FALSE(t.mapped(0x40800000, 8 * MiB, 6, &sized));  // sized once
  VmmTracker::Physical gone;
  EXPECT_FALSE(t.released(6, &gone));
  std::vector<VmmTracker::Physical> out;
  t.unmapped(0x40000000, 16 * MiB, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].size, 8 * MiB);
}

TEST(VmmTracker, ImportedAndReleasedBeforeMappingLeavesNothing) {
  VmmTracker t;
  VmmTracker::Physical gone;
  t.imported(7, 0);
  EXPECT_FALSE(t.released(7, &gone));  // never counted, so nothing to drop
}

TEST(VmmTracker, MappingsOfUnknownHandlesAreIgnored) {
  VmmTracker t;
  VmmTracker::Physical gone;
  EXPECT_FALSE(t.mapped(0x50000000, 2 * MiB, 99, &gone));  // e.g. a pool of the shim's own
  std::vector<VmmTracker::Physical> out;
  t.unmapped(0x50000000, 2 * MiB, &out);
  EXPECT_TRUE(out.empty());
}

TEST(VmmTracker, AddressSpaceIsTrackedAndFreeingItDropsItsMappings) {
  VmmTracker t;
  VmmTracker::Physical gone;
  t.address_reserved(0x60000000, 8 * MiB);
  t.address_reserved(0x70000000, 4 * MiB);
  EXPECT_EQ(t.reserved_va_bytes(), 12 * MiB);
  t.created(device_chunk(8, 2 * MiB));
  t.mapped(0x60000000, 2 * MiB, 8, &gone);
  t.released(8, &gone);
  std::vector<VmmTracker::Physical> out;
  t.address_freed(0x60000000, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(t.reserved_va_bytes(), 4 * MiB);
  t.address_freed(0x12345, &out);  // unknown: nothing
  EXPECT_EQ(t.reserved_va_bytes(), 4 * MiB);
}

TEST(VmmTracker, KeysOfHandlesNeverCollideWithUserSpacePointers) {
  EXPECT_GE(VmmTracker::key_of(1), 1ull << 63);
  EXPECT_NE(VmmTracker::key_of(1), VmmTracker::key_of(2));
}

}  // namespace
}  // namespace gpushim
