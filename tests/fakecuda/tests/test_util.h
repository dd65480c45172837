// Shared helpers of the fake CUDA device tests.
//
// Tests include the real CUDA headers normally (no __CUDA_API_VERSION_INTERNAL), so cuMemAlloc
// expands to cuMemAlloc_v2 etc. exactly as in any CUDA program; linking then proves the fake
// exports the real names.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "fakecuda.h"

namespace fakecuda_test {

inline std::string CuName(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(r));
}

#define ASSERT_CU(expr) ASSERT_EQ(CUDA_SUCCESS, (expr)) << #expr << " -> " << ::fakecuda_test::CuName(expr)
#define EXPECT_CU(expr) EXPECT_EQ(CUDA_SUCCESS, (expr)) << #expr
#define ASSERT_RT(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr
#define EXPECT_RT(expr) EXPECT_EQ(cudaSuccess, (expr)) << #expr

// Driver-API tests: cuInit plus device 0's primary context current on the test thread. The
// retain is kept (never released) so that the context, and the runtime's binding to it, survive
// from test to test when the whole binary runs in one process; ctest runs each test alone.
class DriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
  }
  void TearDown() override { cuCtxSynchronize(); }
  CUcontext ctx_ = nullptr;
};

// Runs `body` in a process of its own: a death-test child, which the threadsafe style
// (main.cpp) starts by executing this binary anew. For a test that counts from a fresh process's
// state, such as how many retains the primary context has: earlier tests of the same binary keep
// theirs (DriverTest), so without this such a test passed under ctest, one test per process, and
// failed when the binary ran whole.
template <typename Body>
void InFreshProcess(Body body) {
  EXPECT_EXIT(
      {
        body();
        // The child's failures, where the parent shows them (a death test shows only stderr).
        const ::testing::TestResult* r = ::testing::UnitTest::GetInstance()->current_test_info()->result();
        for (int i = 0; i < r->total_part_count(); ++i)
          std::fprintf(stderr, "%s:%d: %s\n", r->GetTestPartResult(i).file_name(),
                       r->GetTestPartResult(i).line_number(), r->GetTestPartResult(i).message());
        std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// Runtime-API tests. cudaFree(nullptr) initializes the context like in real programs.
class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_RT(cudaFree(nullptr));
    cudaGetLastError();
  }
  void TearDown() override { cudaDeviceSynchronize(); }
};

inline double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct ChildResult {
  int exit_code = -1;   // -1: killed by a signal or timed out
  std::string output;   // stdout and stderr together
  double seconds = 0;
};

// Runs this test binary again with `args` (handled by RunChildMode in main.cpp), with `env`
// overriding the environment. Kills it after `timeout_s`. Descriptors without FD_CLOEXEC are
// inherited, which is how a test hands an exported memory fd to the child.
ChildResult RunChild(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
                     double timeout_s = 10);

// A kernel or host function long enough that the host sees the work still pending (200 ms).
inline constexpr unsigned kDelayUs = 200000;

// The exported symbol name of a function pointer, as an interposer would learn it with dladdr.
inline std::string SymbolOf(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_sname == nullptr) return "<none>";
  return info.dli_sname;
}

}  // namespace fakecuda_test
