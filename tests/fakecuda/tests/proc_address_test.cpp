// cuGetProcAddress(_v2): base name + version + flags -> exact exported variant; and the route the
// runtime takes to the driver.
#include <dlfcn.h>

#include "test_util.h"

namespace fakecuda_test {
namespace {

std::string Resolve(const char* name, int version, cuuint64_t flags, CUresult* result = nullptr,
                    CUdriverProcAddressQueryResult* status = nullptr) {
  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = cuGetProcAddress(name, &fn, version, flags, &st);  // macro: cuGetProcAddress_v2
  if (result != nullptr) *result = r;
  if (status != nullptr) *status = st;
  return r == CUDA_SUCCESS ? SymbolOf(fn) : (fn == nullptr ? "<null>" : "<garbage>");
}

TEST(ProcAddress, PicksTheVersionedVariant) {
  EXPECT_EQ(Resolve("cuMemAlloc", 3020, 0), "cuMemAlloc_v2");
  EXPECT_EQ(Resolve("cuMemAlloc", 13000, 0), "cuMemAlloc_v2");
  EXPECT_EQ(Resolve("cuMemFree", 3020, 0), "cuMemFree_v2");
  EXPECT_EQ(Resolve("cuMemGetInfo", 3020, 0), "cuMemGetInfo_v2");
  EXPECT_EQ(Resolve("cuMemAllocPitch", 3020, 0), "cuMemAllocPitch_v2");
  EXPECT_EQ(Resolve("cuMemAllocManaged", 6000, 0), "cuMemAllocManaged");
  EXPECT_EQ(Resolve("cuMemHostAlloc", 2020, 0), "cuMemHostAlloc");
  EXPECT_EQ(Resolve("cuIpcOpenMemHandle", 4010, 0), "cuIpcOpenMemHandle");
  EXPECT_EQ(Resolve("cuIpcOpenMemHandle", 11000, 0), "cuIpcOpenMemHandle_v2");
  EXPECT_EQ(Resolve("cuStreamBeginCapture", 10000, 0), "cuStreamBeginCapture");
  EXPECT_EQ(Resolve("cuStreamBeginCapture", 10010, 0), "cuStreamBeginCapture_v2");
  EXPECT_EQ(Resolve("cuStreamGetCaptureInfo", 12030, 0), "cuStreamGetCaptureInfo_v3");
  EXPECT_EQ(Resolve("cuStreamGetCaptureInfo", 12000, 0), "cuStreamGetCaptureInfo_v2");
  EXPECT_EQ(Resolve("cuEventElapsedTime", 12000, 0), "cuEventElapsedTime");
  EXPECT_EQ(Resolve("cuEventElapsedTime", 12080, 0), "cuEventElapsedTime_v2");
  EXPECT_EQ(Resolve("cuMemCreate", 10020, 0), "cuMemCreate");
  // The CUDA 7-10 primary-context entry points, which NVIDIA's libcuda still exports.
  EXPECT_EQ(Resolve("cuDevicePrimaryCtxRelease", 10020, 0), "cuDevicePrimaryCtxRelease");
  EXPECT_EQ(Resolve("cuDevicePrimaryCtxRelease", 11000, 0), "cuDevicePrimaryCtxRelease_v2");
  EXPECT_EQ(Resolve("cuDevicePrimaryCtxReset", 10020, 0), "cuDevicePrimaryCtxReset");
  EXPECT_EQ(Resolve("cuDevicePrimaryCtxReset", 11000, 0), "cuDevicePrimaryCtxReset_v2");
}

TEST(ProcAddress, PerThreadFlagSelectsPtszVariants) {
  constexpr cuuint64_t kPts = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  constexpr cuuint64_t kLegacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  EXPECT_EQ(Resolve("cuMemAllocAsync", 11020, 0), "cuMemAllocAsync");
  EXPECT_EQ(Resolve("cuMemAllocAsync", 11020, kLegacy), "cuMemAllocAsync");
  EXPECT_EQ(Resolve("cuMemAllocAsync", 11020, kPts), "cuMemAllocAsync_ptsz");
  EXPECT_EQ(Resolve("cuMemAllocFromPoolAsync", 11020, kPts), "cuMemAllocFromPoolAsync_ptsz");
  EXPECT_EQ(Resolve("cuMemFreeAsync", 11020, kPts), "cuMemFreeAsync_ptsz");
  EXPECT_EQ(Resolve("cuMemcpyHtoD", 3020, kPts), "cuMemcpyHtoD_v2_ptds");
  EXPECT_EQ(Resolve("cuMemcpyHtoDAsync", 3020, kPts), "cuMemcpyHtoDAsync_v2_ptsz");
  EXPECT_EQ(Resolve("cuMemsetD8", 3020, kPts), "cuMemsetD8_v2_ptds");
  EXPECT_EQ(Resolve("cuStreamSynchronize", 2000, kPts), "cuStreamSynchronize_ptsz");
  EXPECT_EQ(Resolve("cuStreamBeginCapture", 12000, kPts), "cuStreamBeginCapture_v2_ptsz");
  EXPECT_EQ(Resolve("cuEventRecord", 2000, kPts), "cuEventRecord_ptsz");
  // No per-thread variant: the ordinary one.
  EXPECT_EQ(Resolve("cuMemAlloc", 3020, kPts), "cuMemAlloc_v2");
  EXPECT_EQ(Resolve("cuCtxSynchronize", 2000, kPts), "cuCtxSynchronize");
}

TEST(ProcAddress, GetProcAddressItselfByVersion) {
  EXPECT_EQ(Resolve("cuGetProcAddress", 11030, 0), "cuGetProcAddress");
  EXPECT_EQ(Resolve("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
  EXPECT_EQ(Resolve("cuGetProcAddress", 13000, 0), "cuGetProcAddress_v2");
  EXPECT_EQ(Resolve("cuGetExportTable", 3000, 0), "cuGetExportTable");
}

TEST(ProcAddress, UnknownNamesAndOldVersions) {
  CUresult r;
  CUdriverProcAddressQueryResult st;
  EXPECT_EQ(Resolve("", 13000, 0, &r, &st), "<null>");
  EXPECT_EQ(r, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(Resolve("cuNoSuchFunction", 13000, 0, &r, &st), "<null>");
  EXPECT_EQ(r, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  // Exported names are not base names.
  EXPECT_EQ(Resolve("cuMemAlloc_v2", 13000, 0, &r, &st), "<null>");
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(Resolve("cuMemAlloc", 3010, 0, &r, &st), "<null>");
  EXPECT_EQ(r, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(Resolve("cuMemAllocAsync", 11010, 0, &r, &st), "<null>");
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(Resolve("cuMemAlloc", 13000, 0, &r, &st), "cuMemAlloc_v2");
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
  void* fn = nullptr;
  EXPECT_EQ(cuGetProcAddress(nullptr, &fn, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress("cuInit", &fn, 13000, 8, &st), CUDA_ERROR_INVALID_VALUE);
  // A version newer than the driver (13.0) is refused, as cuda.h says, in both forms.
  int driver = 0;
  ASSERT_CU(cuDriverGetVersion(&driver));
  EXPECT_EQ(cuGetProcAddress("cuMemAlloc", &fn, driver + 10, 0, &st), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress("cuMemAlloc", &fn, 99990, 0, &st), CUDA_ERROR_INVALID_VALUE);
  using GetProc4 = CUresult (*)(const char*, void**, int, cuuint64_t);
  ASSERT_CU(cuGetProcAddress("cuGetProcAddress", &fn, 11030, 0, nullptr));
  EXPECT_EQ(reinterpret_cast<GetProc4>(fn)("cuMemAlloc", &fn, driver + 10, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST(ProcAddress, FourArgumentForm) {
  using GetProc4 = CUresult (*)(const char*, void**, int, cuuint64_t);
  void* fn = nullptr;
  ASSERT_CU(cuGetProcAddress("cuGetProcAddress", &fn, 11030, 0, nullptr));
  auto get4 = reinterpret_cast<GetProc4>(fn);
  void* alloc = nullptr;
  ASSERT_CU(get4("cuMemAllocAsync", &alloc, 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
  EXPECT_EQ(SymbolOf(alloc), "cuMemAllocAsync_ptsz");
  EXPECT_EQ(get4("nope", &alloc, 13000, 0), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(alloc, nullptr);
}

TEST(ProcAddress, ResolvedPointersAreTheExportedFunctions) {
  void* fn = nullptr;
  ASSERT_CU(cuGetProcAddress("cuMemAlloc", &fn, 3020, 0, nullptr));
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuMemAlloc_v2));
  void* via_dlsym = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  EXPECT_EQ(fn, via_dlsym);
}

// The runtime must reach the driver like NVIDIA's: probe with "", then every function by base
// name through cuGetProcAddress_v2, with the documented versions and flags. Checked in a fresh
// process, where nothing but the runtime's initialization has queried the driver.
TEST(ProcAddress, RuntimeResolvesTheDriverThroughGetProcAddress) {
  ChildResult r = RunChild({"--child=runtime-queries"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto count = [&](const std::string& key) {
    const std::string needle = "\n" + key + "=";
    const std::size_t at = ("\n" + r.output).find(needle);
    if (at == std::string::npos) return -1;
    return std::atoi(r.output.c_str() + at + needle.size() - 1);
  };
  const std::string pts = std::to_string(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  EXPECT_EQ(count("@-1/any"), 1) << r.output;  // the empty-name probe
  EXPECT_EQ(count("cuGetProcAddress@12000/0"), 1);
  EXPECT_EQ(count("cuMemAlloc@3020/0"), 1);
  EXPECT_EQ(count("cuMemFree@3020/0"), 1);
  EXPECT_EQ(count("cuMemAllocPitch@3020/0"), 1);
  EXPECT_EQ(count("cuMemGetInfo@3020/0"), 1);
  EXPECT_EQ(count("cuMemAllocManaged@6000/0"), 1);
  EXPECT_EQ(count("cuMemHostAlloc@2020/0"), 1);
  for (const char* name : {"cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"}) {
    EXPECT_EQ(count(std::string(name) + "@11020/0"), 1) << name;
    EXPECT_EQ(count(std::string(name) + "@11020/" + pts), 1) << name;
  }
  EXPECT_EQ(count("cuIpcOpenMemHandle@4010/0"), 1);
  EXPECT_EQ(count("cuIpcOpenMemHandle@11000/0"), 1);
  EXPECT_EQ(count("cuGraphAddMemAllocNode@11040/0"), 1);
  EXPECT_EQ(count("cuDeviceGraphMemTrim@11040/0"), 1);
  EXPECT_EQ(count("cuGetExportTable@-1/any"), 1);
  // The runtime never asks for exported (versioned) names.
  EXPECT_EQ(count("cuMemAlloc_v2@-1/any"), 0);
}

// cudaGetDriverEntryPoint is deprecated in CUDA 13 but still exported and used.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(ProcAddress, RuntimeEntryPointsMapFlags) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
  ASSERT_RT(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnableDefault, &st));
  EXPECT_EQ(st, cudaDriverEntryPointSuccess);
  EXPECT_EQ(SymbolOf(fn), "cuMemAllocAsync");
  ASSERT_RT(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnablePerThreadDefaultStream, &st));
  EXPECT_EQ(SymbolOf(fn), "cuMemAllocAsync_ptsz");
  ASSERT_RT(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000, cudaEnableDefault, &st));
  EXPECT_EQ(SymbolOf(fn), "cuMemCreate");
  // Missing symbols are not errors; the status says why.
  ASSERT_RT(cudaGetDriverEntryPoint("cuDoesNotExist", &fn, cudaEnableDefault, &st));
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(st, cudaDriverEntryPointSymbolNotFound);
  ASSERT_RT(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 11000, cudaEnableDefault, &st));
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(st, cudaDriverEntryPointVersionNotSufficent);
  // A version newer than the driver is invalid.
  EXPECT_EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 99000, cudaEnableDefault, &st), cudaErrorInvalidValue);
  cudaGetLastError();
}
#pragma GCC diagnostic pop

}  // namespace
}  // namespace fakecuda_test
