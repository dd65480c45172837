// Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle).
//
// As in CUDA, a handle describes the WHOLE cuMemAlloc allocation containing the pointer, and the
// importer gets the base of that allocation. The handle names the exporter's device memfd by pid
// and descriptor number; the importer maps the allocation's byte range of that memfd through
// /proc/<pid>/fd/<fd>, so both processes share the same bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "driver.h"

namespace fakecuda {
namespace {

constexpr std::uint32_t kIpcMagic = 0x46434950;  // "FCIP"

struct IpcPayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t device;
  std::int32_t fd;
  std::uint64_t offset;     // of the allocation in the exporter's device memfd
  std::uint64_t size;       // requested size of the allocation
  std::uint64_t buffer_id;  // distinguishes a reallocation at the same address
};
static_assert(sizeof(IpcPayload) <= CU_IPC_HANDLE_SIZE);

std::size_t PageSize() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Region* region = FindRegion(s, dptr);
  // Only cuMemAlloc'd memory is legacy-IPC capable (not VMM mappings, pool or graph memory).
  if (region == nullptr || region->kind != RegionKind::kDeviceMalloc) return CUDA_ERROR_INVALID_VALUE;
  const Device& dev = *s.devices[static_cast<std::size_t>(region->device)];
  IpcPayload payload{};
  payload.magic = kIpcMagic;
  payload.pid = getpid();
  payload.device = region->device;
  payload.fd = dev.arena.fd();
  payload.offset = region->arena_offset;
  payload.size = region->size;
  payload.buffer_id = region->buffer_id;
  std::memset(pHandle, 0, sizeof(*pHandle));
  std::memcpy(pHandle->reserved, &payload, sizeof(payload));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (pdptr == nullptr || (Flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcPayload payload{};
  std::memcpy(&payload, handle.reserved, sizeof(payload));
  if (payload.magic != kIpcMagic || payload.size == 0) return CUDA_ERROR_INVALID_VALUE;
  // CUDA refuses to open a handle in the process that exported it.
  if (payload.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;

  // Opening the same allocation again returns the same mapping, reference counted.
  for (auto& [base, region] : s.regions) {
    if (region.kind == RegionKind::kIpcImport && region.import_pid == static_cast<std::uint64_t>(payload.pid) &&
        region.import_buffer_id == payload.buffer_id) {
      ++region.import_refs;
      *pdptr = base;
      return CUDA_SUCCESS;
    }
  }

  const std::string path = "/proc/" + std::to_string(payload.pid) + "/fd/" + std::to_string(payload.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // exporter gone or not ours
  // mmap needs a page-aligned file offset; allocations are only 512-byte aligned.
  const std::size_t page_offset = payload.offset % PageSize();
  const std::size_t file_offset = payload.offset - page_offset;
  const std::size_t length = RoundUp(page_offset + payload.size, PageSize());
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(file_offset));
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;

  Region r;
  r.base = reinterpret_cast<std::uintptr_t>(p) + page_offset;
  r.size = payload.size;
  r.kind = RegionKind::kIpcImport;
  r.device = (payload.device >= 0 && payload.device < static_cast<int>(s.devices.size())) ? payload.device : ctx->device;
  r.ctx = ctx;
  r.buffer_id = NextId(s);
  r.map_base = reinterpret_cast<std::uintptr_t>(p);
  r.map_length = length;
  r.import_refs = 1;
  r.import_pid = static_cast<std::uint64_t>(payload.pid);
  r.import_buffer_id = payload.buffer_id;
  s.regions[r.base] = r;
  *pdptr = r.base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  auto it = s.regions.find(dptr);
  if (it == s.regions.end() || it->second.kind != RegionKind::kIpcImport) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.import_refs == 0) ReleaseRegion(s, dptr);
  return CUDA_SUCCESS;
}

// The pre-11.0 entry point (cudaVersion 4010); same behaviour.
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}
