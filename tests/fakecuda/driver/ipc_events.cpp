// Interprocess events: cuIpcGetEventHandle / cuIpcOpenEventHandle, and the shared page that carries
// an interprocess event's completion between processes.
//
// The page is a memfd holding two counters: records started (bumped when a record is issued) and
// records completed (published by the record's op when the stream reaches it). An event is done
// when the newest record issued has completed. The handle names the exporter's memfd by pid and
// descriptor number; the importer maps it through /proc/<pid>/fd/<fd>, as legacy memory IPC does.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "driver.h"

namespace fakecuda {

struct IpcEventPage {
  int fd = -1;
  std::atomic<std::uint64_t>* counters = nullptr;  // [0] records issued, [1] newest record completed
  ~IpcEventPage() {
    if (counters != nullptr) munmap(counters, kBytes);
    if (fd >= 0) close(fd);
  }
  static constexpr std::size_t kBytes = 4096;
};

namespace {

constexpr std::uint32_t kIpcEventMagic = 0x46434945;  // "FCIE"

struct IpcEventPayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
};
static_assert(sizeof(IpcEventPayload) <= CU_IPC_HANDLE_SIZE);

std::shared_ptr<IpcEventPage> MapPage(int fd) {
  void* p = mmap(nullptr, IpcEventPage::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  auto page = std::make_shared<IpcEventPage>();
  page->fd = fd;
  page->counters = static_cast<std::atomic<std::uint64_t>*>(p);
  return page;
}

}  // namespace

std::shared_ptr<IpcEventPage> CreateIpcEventPage() {
  // Not close-on-exec: an importer opens it through /proc/<pid>/fd while this process lives.
  int fd = memfd_create("fakecuda-ipc-event", 0);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, IpcEventPage::kBytes) != 0) {
    close(fd);
    return nullptr;
  }
  return MapPage(fd);
}

std::uint64_t IpcEventRecorded(const IpcEventPage& page) { return page.counters[0].fetch_add(1) + 1; }

std::uint64_t IpcEventTarget(const IpcEventPage& page) { return page.counters[0].load(); }

void IpcEventComplete(const IpcEventPage& page, std::uint64_t record) {
  std::uint64_t done = page.counters[1].load();
  while (done < record && !page.counters[1].compare_exchange_weak(done, record)) {
  }
}

bool IpcEventDone(const IpcEventPage& page, std::uint64_t record) { return page.counters[1].load() >= record; }

}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.events.find(event);
  if (it == s.events.end()) BadHandle(s, "cuIpcGetEventHandle", HandleKind::kEvent, reinterpret_cast<std::uintptr_t>(event));
  if (!(it->second->flags & CU_EVENT_INTERPROCESS)) return CUDA_ERROR_INVALID_HANDLE;
  IpcEventPayload payload{kIpcEventMagic, static_cast<std::int32_t>(getpid()), it->second->ipc->fd};
  std::memset(pHandle, 0, sizeof(*pHandle));
  std::memcpy(pHandle->reserved, &payload, sizeof(payload));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  IpcEventPayload payload;
  std::memcpy(&payload, handle.reserved, sizeof(payload));
  if (payload.magic != kIpcEventMagic) return CUDA_ERROR_INVALID_VALUE;
  // Like CUDA, an event cannot be opened in the process that exported it.
  if (payload.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  const std::string path = "/proc/" + std::to_string(payload.pid) + "/fd/" + std::to_string(payload.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // the exporter is gone
  auto ev = std::make_shared<Event>();
  ev->ctx = ctx;
  ev->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  ev->ipc = MapPage(fd);
  if (!ev->ipc) return CUDA_ERROR_OUT_OF_MEMORY;
  ev->handle = MintHandle(s, HandleKind::kEvent);
  s.events[reinterpret_cast<const void*>(ev->handle)] = ev;
  *phEvent = reinterpret_cast<CUevent>(ev->handle);
  return CUDA_SUCCESS;
}
