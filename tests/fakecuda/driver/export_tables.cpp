// cuGetExportTable: the undocumented tables, keyed by UUID, through which NVIDIA's runtime
// (statically linked into every default nvcc build, NCCL, cuBLAS...) reaches the driver beside
// cuGetProcAddress.
//
// What CUDA 13.0's static runtime asks for was found by observation only (which UUIDs it requests,
// in which order, which slots it calls with which arguments; see docs/interception.md). The fake
// serves the least that lets the runtime reach its last initialization step:
//
//   6bd5fb6c-5bf4-e74a-8987-d93912fd9df9  cudart interface: slot 2 = retain the primary context of
//                                         a device (CUcontext*, CUdevice)
//   a094798c-2e74-2e74-93f2-0800200c0a66  tools runtime-callback hooks: slots 2 and 6 hand the runtime
//                                         two buffers it owns for tool callbacks (void**, size_t*)
//   42d85a81-23f6-cb47-8298-f6e78a3aecdc  tools TLS: requested, never called
//   c693336e-1121-df11-a8c3-68f355d89593  context-local storage: requested, never called
//   263e8860-7cd2-6143-92f6-bbd5006dfa7e  context checks: slot 3 is called once and must succeed
//   d4082055-bde6-704b-8d34-ba123c66e1f2  integrity check: slot 1 (cudaVersion, unix time, out[2])
//                                         must return a keyed digest that proves the driver is
//                                         NVIDIA's. The fake cannot and does not: it answers
//                                         CUDA_ERROR_NOT_SUPPORTED, and the runtime then fails every
//                                         call with cudaErrorNotSupported (801).
//
// f8cff951-2146-8b4e-b9e2-fb469e7c0dd9 is requested first; refusing it changes nothing, so it is
// refused, like every UUID not listed. Slots not listed answer CUDA_ERROR_NOT_SUPPORTED.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "driver.h"

namespace fakecuda {
namespace {

// FAKECUDA_TRACE_EXPORT_TABLES=1: one stderr line per request, so tests (and people extending the
// fake to a newer runtime) can see what a runtime asks for.
bool TraceRequests() {
  static const bool trace = [] {
    const char* v = std::getenv("FAKECUDA_TRACE_EXPORT_TABLES");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return trace;
}

// Slot 0 of most tables holds the table's size in bytes, which the runtime checks.
constexpr std::size_t kSlots = 16;
using Table = const void* [kSlots];

template <typename F>
const void* Slot(F* f) {
  return reinterpret_cast<const void*>(f);
}
const void* SizeSlot() { return reinterpret_cast<const void*>(std::uintptr_t{sizeof(Table)}); }

// Every slot the fake does not simulate. The x86-64 and AArch64 C ABIs let a function taking no
// arguments be called with any.
CUresult NotSimulated() { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult CudartRetainPrimaryContext(CUcontext* pctx, CUdevice dev) { return cuDevicePrimaryCtxRetain(pctx, dev); }

// Buffers the runtime registers its tool-callback state in; it only needs them to exist.
std::uint64_t g_callback_buffer[1024];
unsigned char g_callback_flags[16];
void ToolsCallbackBuffer(void** data, std::size_t* count) {
  if (data != nullptr) *data = g_callback_buffer;
  if (count != nullptr) *count = sizeof(g_callback_buffer) / sizeof(g_callback_buffer[0]);
}
void ToolsCallbackFlags(void** data, std::size_t* count) {
  if (data != nullptr) *data = g_callback_flags;
  if (count != nullptr) *count = 14;  // the runtime's own flag count: it ignores a longer array
}

CUresult ContextCheck() { return CUDA_SUCCESS; }

CUresult IntegrityCheck(unsigned int cudaVersion, std::uint64_t unix_seconds, std::uint64_t digest[2]) {
  (void)unix_seconds;
  (void)digest;
  if (TraceRequests()) std::fprintf(stderr, "fakecuda: integrity check for CUDA %u: not simulated\n", cudaVersion);
  return CUDA_ERROR_NOT_SUPPORTED;
}

struct KnownTable {
  const char* uuid;  // 32 lowercase hex digits, bytes in order
  const char* name;
  const void* const* table;
};

#define FAKECUDA_UNSIMULATED_13 \
  Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), \
  Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), \
  Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated)

const Table kCudartInterface = {SizeSlot(), Slot(NotSimulated), Slot(CudartRetainPrimaryContext),
                                FAKECUDA_UNSIMULATED_13};
const Table kToolsCallbackHooks = {SizeSlot(),         Slot(NotSimulated),         Slot(ToolsCallbackBuffer),
                                   Slot(NotSimulated), Slot(NotSimulated),         Slot(NotSimulated),
                                   Slot(ToolsCallbackFlags), Slot(NotSimulated),   Slot(NotSimulated),
                                   Slot(NotSimulated), Slot(NotSimulated),         Slot(NotSimulated),
                                   Slot(NotSimulated), Slot(NotSimulated),         Slot(NotSimulated),
                                   Slot(NotSimulated)};
const Table kToolsTls = {SizeSlot(), Slot(NotSimulated), Slot(NotSimulated), FAKECUDA_UNSIMULATED_13};
// No size slot: this table starts with functions.
const Table kContextLocalStorage = {Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated),
                                    FAKECUDA_UNSIMULATED_13};
const Table kContextChecks = {SizeSlot(), Slot(NotSimulated), Slot(NotSimulated), Slot(ContextCheck),
                              Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated),
                              Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated),
                              Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated), Slot(NotSimulated)};
const Table kIntegrityCheck = {SizeSlot(), Slot(IntegrityCheck), Slot(NotSimulated), FAKECUDA_UNSIMULATED_13};
#undef FAKECUDA_UNSIMULATED_13

const KnownTable kTables[] = {
    {"6bd5fb6c5bf4e74a8987d93912fd9df9", "cudart interface", kCudartInterface},
    {"a094798c2e742e7493f20800200c0a66", "tools runtime callback hooks", kToolsCallbackHooks},
    {"42d85a8123f6cb478298f6e78a3aecdc", "tools TLS", kToolsTls},
    {"c693336e1121df11a8c368f355d89593", "context-local storage", kContextLocalStorage},
    {"263e88607cd2614392f6bbd5006dfa7e", "context checks", kContextChecks},
    {"d4082055bde6704b8d34ba123c66e1f2", "integrity check (not simulated)", kIntegrityCheck},
};

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  char hex[33];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned char>(pExportTableId->bytes[i]));
  }
  for (const KnownTable& t : kTables) {
    if (std::strcmp(hex, t.uuid) == 0) {
      if (TraceRequests()) std::fprintf(stderr, "fakecuda: export table %s: %s\n", hex, t.name);
      *ppExportTable = t.table;
      return CUDA_SUCCESS;
    }
  }
  if (TraceRequests()) std::fprintf(stderr, "fakecuda: export table %s: refused\n", hex);
  *ppExportTable = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}
