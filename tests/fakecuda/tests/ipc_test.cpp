// Legacy CUDA IPC across processes, with CUDA's "whole allocation" semantics.
#include <cstdio>

#include "test_util.h"

namespace fakecuda_test {
namespace {

std::string Hex(const cudaIpcMemHandle_t& h) {
  std::string out;
  char buf[3];
  for (char c : h.reserved) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(c));
    out += buf;
  }
  return out;
}

using Ipc = RuntimeTest;

TEST_F(Ipc, AnotherProcessSeesAndChangesTheAllocation) {
  constexpr size_t kSize = 3 << 20;
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, kSize));
  ASSERT_RT(cudaMemset(p, 0x21, kSize));
  cudaIpcMemHandle_t handle;
  ASSERT_RT(cudaIpcGetMemHandle(&handle, p));
  ChildResult r = RunChild({"--child=ipc-open", Hex(handle), std::to_string(kSize), "33", "66"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<unsigned char> host(kSize);
  ASSERT_RT(cudaMemcpy(host.data(), p, kSize, cudaMemcpyDeviceToHost));
  EXPECT_EQ(host[0], 66);
  EXPECT_EQ(host[kSize - 1], 66);
  ASSERT_RT(cudaFree(p));
}

// A handle taken from an interior pointer describes the whole allocation: the importer gets the
// allocation's base (so a pool that sub-allocates hands out the wrong bytes, as with real CUDA).
TEST_F(Ipc, HandleOfAnInteriorPointerMapsTheWholeAllocation) {
  constexpr size_t kSize = 1 << 20;
  unsigned char* p = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&p), kSize));
  ASSERT_RT(cudaMemset(p, 0x01, kSize / 2));
  ASSERT_RT(cudaMemset(p + kSize / 2, 0x02, kSize / 2));
  cudaIpcMemHandle_t from_base, from_inner;
  ASSERT_RT(cudaIpcGetMemHandle(&from_base, p));
  ASSERT_RT(cudaIpcGetMemHandle(&from_inner, p + kSize / 2));
  EXPECT_EQ(Hex(from_base), Hex(from_inner));
  // The child checks the first bytes it maps: they are the base's (1), not the interior's (2).
  ChildResult r = RunChild({"--child=ipc-open", Hex(from_inner), std::to_string(kSize / 2), "1", "9"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(p[0], 9);
  EXPECT_EQ(p[kSize / 2], 2);
  ASSERT_RT(cudaFree(p));
}

TEST_F(Ipc, OpeningInTheExportingProcessFails) {
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 4096));
  cudaIpcMemHandle_t handle;
  ASSERT_RT(cudaIpcGetMemHandle(&handle, p));
  void* q = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&q, handle, cudaIpcMemLazyEnablePeerAccess), cudaErrorDeviceUninitialized);
  EXPECT_EQ(cudaGetLastError(), cudaErrorDeviceUninitialized);
  cudaIpcMemHandle_t garbage{};
  EXPECT_EQ(cudaIpcOpenMemHandle(&q, garbage, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_RT(cudaFree(p));
}

TEST_F(Ipc, OnlyCudaMallocMemoryIsIpcCapable) {
  cudaIpcMemHandle_t handle;
  int local = 0;
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, &local), cudaErrorInvalidValue);
  void* managed = nullptr;
  ASSERT_RT(cudaMallocManaged(&managed, 4096));
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, managed), cudaErrorInvalidValue);
  void* pooled = nullptr;
  ASSERT_RT(cudaMallocAsync(&pooled, 4096, nullptr));
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, pooled), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_RT(cudaFreeAsync(pooled, nullptr));
  ASSERT_RT(cudaFree(managed));
}

}  // namespace
}  // namespace fakecuda_test
