// cuGetProcAddress under the shim, asked the way runtimes and libraries ask: which variant comes
// back for each (name, version, flags), whether the driver saw the caller's exact version and
// flags, and what happens to names the shim does not hook. Reaches the driver like a library with
// a static runtime (dlopen + dlsym of cuGetProcAddress_v2), plus cudaGetDriverEntryPoint*.
// Whether the driver saw the exact query is counted by the simulated driver only
// (fakecudaProcAddressQueryCount); on NVIDIA's driver that field is -1 (not observable).
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "support/test_support.h"

namespace {

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using QueryCount = unsigned long long (*)(const char*, int, unsigned long long);

std::string where(void* p) {
  if (p == nullptr) return "null";
  Dl_info info;
  if (dladdr(p, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const char* base = std::strrchr(info.dli_fname, '/');
  return std::string(base ? base + 1 : info.dli_fname) + ":" + (info.dli_sname ? info.dli_sname : "?");
}

bool first = true;
void field(const std::string& key, const std::string& json_value) {
  std::printf("%s\"%s\":%s", first ? "" : ",", key.c_str(), json_value.c_str());
  first = false;
}
std::string str(const std::string& s) { return "\"" + s + "\""; }

}  // namespace

int main() {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto get_proc = reinterpret_cast<GetProcV2>(dlsym(cuda, "cuGetProcAddress_v2"));
  auto queries = reinterpret_cast<QueryCount>(dlsym(cuda, "fakecudaProcAddressQueryCount"));
  if (get_proc == nullptr) return 2;
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(cuda, "cuInit"));
  if (init == nullptr || init(0) != CUDA_SUCCESS) return 2;
  std::printf("{");

  struct Q {
    const char* key;
    const char* name;
    int version;
    cuuint64_t flags;
  };
  const Q qs[] = {
      {"probe", "", 13000, 0},
      {"alloc", "cuMemAlloc", 3020, 0},
      {"alloc_async_legacy", "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_LEGACY_STREAM},
      {"alloc_async_ptsz", "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"free_async_ptsz", "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"from_pool_ptsz", "cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"get_proc_4", "cuGetProcAddress", 11030, 0},
      {"get_proc_5", "cuGetProcAddress", 12000, 0},
      {"memcpy_ptds", "cuMemcpy", 4000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"export_table", "cuGetExportTable", 3000, 0},
      {"unknown", "cuNoSuchFunction", 13000, 0},
      {"too_new", "cuMemAllocAsync", 11000, 0},
      {"not_a_driver_name", "cudaMalloc", 13000, 0},
  };
  for (const Q& q : qs) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    const unsigned long long before = queries ? queries(q.name, q.version, q.flags) : 0;
    const CUresult r = get_proc(q.name, &p, q.version, q.flags, &status);
    const std::string seen = queries ? std::to_string(queries(q.name, q.version, q.flags) - before) : "-1";
    field(q.key, "{\"result\":" + std::to_string(r) + ",\"status\":" + std::to_string(status) + ",\"fn\":" +
                     str(where(p)) + ",\"driver_saw_exact_query\":" + seen + "}");
  }

  // The 4-argument form we hand out honours its caller's flags too.
  void* p4 = nullptr;
  get_proc("cuGetProcAddress", &p4, 11030, 0, nullptr);
  auto get_proc4 = reinterpret_cast<GetProcV1>(p4);
  void* ptsz = nullptr;
  const CUresult r4 = get_proc4 ? get_proc4("cuMemAllocAsync", &ptsz, 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
                                : CUDA_ERROR_UNKNOWN;
  field("via_4_arg_ptsz", "{\"result\":" + std::to_string(r4) + ",\"fn\":" + str(where(ptsz)) + "}");

  // cuGetExportTable passes through untouched: same answer as the driver's own.
  using ExportTable = CUresult (*)(const void**, const CUuuid*);
  void* et = nullptr;
  get_proc("cuGetExportTable", &et, 3000, 0, nullptr);
  const void* table = reinterpret_cast<const void*>(1);
  CUuuid id = {};
  const CUresult et_r = et ? reinterpret_cast<ExportTable>(et)(&table, &id) : CUDA_ERROR_UNKNOWN;
  field("export_table_call", "{\"result\":" + std::to_string(et_r) + ",\"table_is_null\":" +
                                 (table == nullptr ? "true" : "false") + "}");

  // Through the runtime: cudaGetDriverEntryPoint* reach cuGetProcAddress_v2 (ours).
  void* ep = nullptr;
  cudaDriverEntryPointQueryResult ep_status = cudaDriverEntryPointSuccess;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // still what many libraries call
  CHECK(cudaGetDriverEntryPoint("cuMemAllocAsync", &ep, cudaEnablePerThreadDefaultStream, &ep_status));
#pragma GCC diagnostic pop
  field("runtime_entry_point_ptsz", str(where(ep)));
  CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &ep, 12000, cudaEnableDefault, &ep_status));
  field("runtime_entry_point_by_version", str(where(ep)));

  // The _ptsz hook we handed out allocates on the per-thread default stream (stream 0).
  CHECK(cudaFree(nullptr));  // a current context, as a library would find it
  void* pa = nullptr;
  get_proc("cuMemAllocAsync", &pa, 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr);
  CUdeviceptr dptr = 0;
  const CUresult ar = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t, CUstream)>(pa)(&dptr, 3 << 20, nullptr);
  field("ptsz_alloc", std::to_string(ar));
  std::printf("}\n");
  return 0;
}
