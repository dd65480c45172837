// Test-only exports of the fake driver (declared in fakecuda.h): what really reached the driver.
#include "driver.h"
#include "../fakecuda.h"

using namespace fakecuda;

size_t fakecudaDeviceUsedBytes(int device) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (device < 0 || device >= static_cast<int>(s.devices.size())) return 0;
  return DeviceUsedBytes(s, *s.devices[static_cast<std::size_t>(device)]);
}

unsigned long long fakecudaDriverAllocCount(void) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  return s.device_alloc_calls;
}

unsigned long long fakecudaDriverFreeCount(void) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  return s.device_free_calls;
}

void fakecudaReuseArrayHandles(int on) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  s.reuse_array_handles = on != 0;
  if (!s.reuse_array_handles) s.reusable_array = s.reusable_mipmapped_array = 0;
}

unsigned long long fakecudaDeviceSyncCount(void) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  return s.device_syncs;
}

unsigned long long fakecudaProcAddressQueryCount(const char* symbol, int cudaVersion, unsigned long long flags) {
  if (symbol == nullptr) return 0;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  unsigned long long total = 0;
  for (const auto& [key, count] : s.proc_queries) {
    const auto& [name, version, f] = key;
    if (name == symbol && (cudaVersion == -1 || version == cudaVersion) && (flags == ~0ULL || f == flags)) {
      total += count;
    }
  }
  return total;
}
