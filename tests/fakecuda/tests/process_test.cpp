// Process lifetime: exit() with queued stream work, and fork() after the device was used.
#include "test_util.h"

namespace fakecuda_test {
namespace {

TEST(Process, ExitWithPendingStreamWorkDoesNotHang) {
  // The child queues about four seconds of work on two streams and calls exit() at once.
  ChildResult r = RunChild({"--child=exit-pending"}, {}, 20);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("child: exiting"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 2.5);
}

TEST(Process, ForkAfterUseNeitherDeadlocksNorLetsTheChildUseTheDevice) {
  ChildResult r = RunChild({"--child=fork"}, {}, 20);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("grandchild: cudaMalloc=3 cuMemGetInfo=3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("child: ok"), std::string::npos) << r.output;
}

TEST(Process, ForkFromAnUnboundThreadWhileThreadsAllocateNeverHangsTheChild) {
  ChildResult r = RunChild({"--child=fork-while-allocating"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("forks=20 hung=0 failed=0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fakecuda_test
