// The pools never name a stream after it is forgotten (DeviceMemoryResource::forget_streams), and
// never record a block's event on the per-thread default stream from a thread other than the one
// that freed it: a real driver crashes on a destroyed stream, and the per-thread handle names
// another stream in every thread.
#include <gtest/gtest.h>

#include <set>

#include "config/config.h"
#include "policy/caching_pool.h"
#include "policy/forwarding_backend.h"
#include "policy/policy_factory.h"
#include "policy/sim_backend.h"
#include "policy/stream_handles.h"
#include "test_sizes.h"

namespace gpushim {
namespace {

CUstream lifetime_stream(uintptr_t v) { return reinterpret_cast<CUstream>(v); }

// Fails the test at any event recorded on a stream it was told is gone, or on the mark.
class StrictStreams final : public ForwardingBackend {
 public:
  explicit StrictStreams(Backend& up) : ForwardingBackend(up) {}
  uint64_t record_event(CUstream s) override {
    EXPECT_EQ(gone.count(s), 0u) << "an event recorded on destroyed stream " << s;
    EXPECT_NE(s, event_ordered_mark()) << "the mark was named to the driver";
    recorded.push_back(s);
    return ForwardingBackend::record_event(s);
  }
  std::set<CUstream> gone;
  std::vector<CUstream> recorded;
};

struct PoolOverStrictStreams {
  explicit PoolOverStrictStreams(PolicyKind policy) : sim(4096 * MiB), strict(sim) {
    Config c;
    c.policy = policy;
    pool = make_pool(c, strict);
    sim.set_events_complete_at_once(false);
  }
  void* alloc(size_t n, CUstream s, bool ordered = true) {
    void* p = nullptr;
    uint64_t got = 0;
    return pool->allocate(AllocRequest{n, s, ordered}, &p, &got) == CUDA_SUCCESS ? p : nullptr;
  }
  // What the core does before forwarding cuStreamDestroy(s).
  void destroy(CUstream s) {
    pool->forget_streams([s](CUstream x) { return x == s; });
    strict.gone.insert(s);
  }
  SimBackend sim;
  StrictStreams strict;
  std::unique_ptr<DeviceMemoryResource> pool;
};

class StreamLifetime : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(StreamLifetime, ABlockFreedOnADestroyedStreamIsOrderedByTheEventRecordedBeforeTheDestroy) {
  for (size_t size : {size_t{4096}, 3 * MiB, 40 * MiB}) {
    SCOPED_TRACE(size);
    PoolOverStrictStreams t(GetParam());
    void* a = t.alloc(size, lifetime_stream(0x100));
    ASSERT_NE(a, nullptr);
    // Live: keeps `a` apart from its segment's free rest (a stream-ordered free would take it in,
    // and the check below would find the block somewhere in the merged whole).
    ASSERT_NE(t.alloc(size, lifetime_stream(0x100)), nullptr);
    ASSERT_EQ(t.pool->deallocate(a, lifetime_stream(0x100), true), CUDA_SUCCESS);
    t.destroy(lifetime_stream(0x100));
    // One event, recorded while the stream existed (at the free, to merge, or at the destroy).
    EXPECT_EQ(t.strict.recorded, std::vector<CUstream>{lifetime_stream(0x100)});
    // The work before the free is still pending: another stream must not get the block, and no
    // allocation may name the destroyed stream (StrictStreams fails the test if one does).
    void* b = t.alloc(size, lifetime_stream(0x200));
    EXPECT_NE(b, a);
    // A new stream that happens to reuse the destroyed one's handle is another stream.
    t.strict.gone.erase(lifetime_stream(0x100));
    void* c = t.alloc(size, lifetime_stream(0x100));
    EXPECT_NE(c, a) << "a new stream with the old handle got memory the old stream's work still used";
    t.sim.complete_events();
    void* d = t.alloc(size, lifetime_stream(0x300));
    EXPECT_EQ(d, a) << "once the event completed, the block serves anyone";
  }
}

TEST_P(StreamLifetime, SplitBlocksShareOneEventPerDestroyedStream) {
  PoolOverStrictStreams t(GetParam());
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(t.alloc(64 << 10, lifetime_stream(0x100)));
  for (void* p : held) ASSERT_EQ(t.pool->deallocate(p, lifetime_stream(0x100), true), CUDA_SUCCESS);
  t.destroy(lifetime_stream(0x100));
  EXPECT_EQ(t.strict.recorded.size(), 1u);
}

TEST_P(StreamLifetime, PerThreadDefaultStreamFreesRecordTheirEventAtTheFree) {
  PoolOverStrictStreams t(GetParam());
  void* a = t.alloc(3 * MiB, CU_STREAM_PER_THREAD);
  ASSERT_EQ(t.pool->deallocate(a, CU_STREAM_PER_THREAD, true), CUDA_SUCCESS);
  // Recorded by the freeing thread, on its own per-thread stream: later, from the allocating
  // thread, the same handle would name that thread's stream, which does not order the free.
  EXPECT_EQ(t.strict.recorded, std::vector<CUstream>{CU_STREAM_PER_THREAD});
  t.strict.gone.insert(CU_STREAM_PER_THREAD);  // no later event may name it
  EXPECT_NE(t.alloc(3 * MiB, CU_STREAM_PER_THREAD), a);
  t.sim.complete_events();
  EXPECT_EQ(t.alloc(3 * MiB, CU_STREAM_PER_THREAD), a);
}

TEST_P(StreamLifetime, OtherStreamsAreLeftAsTheyWere) {
  PoolOverStrictStreams t(GetParam());
  void* a = t.alloc(3 * MiB, lifetime_stream(0x100));
  ASSERT_EQ(t.pool->deallocate(a, lifetime_stream(0x100), true), CUDA_SUCCESS);
  const size_t before = t.strict.recorded.size();
  t.destroy(lifetime_stream(0x200));
  EXPECT_EQ(t.strict.recorded.size(), before) << "nothing to record for a stream no block names";
  EXPECT_EQ(t.alloc(3 * MiB, lifetime_stream(0x100)), a) << "same-stream reuse is still immediate";
}

// A capture on another thread must not stop a loop on its own stream: a block freed there is
// reusable on that stream at once, with no driver call (during a capture the pools neither query
// nor record events, nor synchronize). Held for a fence until the capture ended instead, the loop
// took new memory at every step and ran out.
TEST_P(StreamLifetime, AStreamKeepsReusingItsFreedBlocksDuringACaptureElsewhere) {
  PoolOverStrictStreams p(GetParam());
  const CUstream s = lifetime_stream(0x500);
  void* first = p.alloc(64 * MiB, s);
  ASSERT_NE(first, nullptr);
  p.pool->deallocate(first, s, true);
  p.sim.set_capturing(true);
  const SimCounters before = p.sim.counters();
  auto reserved_bytes = [&] {
    PoolFigures f;
    p.pool->figures(&f);
    return f.reserved_bytes;
  };
  const uint64_t reserved = reserved_bytes();
  for (int i = 0; i < 200; ++i) {  // 12.5 GiB through a 4 GiB device
    void* q = p.alloc(64 * MiB, s);
    ASSERT_NE(q, nullptr) << "step " << i;
    EXPECT_EQ(q, first) << "step " << i;
    EXPECT_EQ(p.pool->deallocate(q, s, true), CUDA_SUCCESS);
  }
  EXPECT_EQ(reserved_bytes(), reserved);
  EXPECT_EQ(p.sim.counters().event_queries, before.event_queries);
  EXPECT_EQ(p.sim.counters().synchronizes, before.synchronizes);
  EXPECT_TRUE(p.strict.recorded.empty());
  p.sim.set_capturing(false);
  // Another stream gets the block once its stream has finished with it, after the capture.
  void* other = p.alloc(64 * MiB, lifetime_stream(0x600));
  EXPECT_NE(other, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Policies, StreamLifetime, ::testing::Values(PolicyKind::kCaching, PolicyKind::kVmm),
                         [](const auto& info) { return info.param == PolicyKind::kCaching ? "caching" : "vmm"; });

}  // namespace
}  // namespace gpushim
