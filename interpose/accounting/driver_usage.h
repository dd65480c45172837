// What the driver says a device has in use (cuMemGetInfo: total - free), sampled next to what we
// saw the process hold on that device at the same instant, so the report can show "unaccounted"
// memory: context, module images, local memory, the device heap, the driver's rounding.
//
// Samples are taken on the allocating thread when the time series takes one (every
// GPUSHIM_SAMPLE_MS at most), right away for a device seen for the first time, and whenever the
// program itself asks for memory figures (cudaMemGetInfo); never at exit: calling CUDA from exit
// handlers is unsafe.
// A sample is kept only if the held figure did not move during the driver call, so the pair
// describes one instant.
//
// On a GPU shared with other processes cuMemGetInfo counts their memory too (it is device-wide);
// the report says so next to the figure (docs/report-format.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace gpushim {

struct UsageSample {
  bool valid = false;
  uint64_t t_ns = 0;       // monotonic, when taken
  uint64_t used = 0;       // total - free, as the driver reported it
  uint64_t held = 0;       // bytes the process held from the driver on the device, as we counted them
};

class DriverUsage {
 public:
  static constexpr int kMaxDevices = 64;

  // Asks for a sample at the next opportunity (the time series just took one).
  void request() { due_.store(true, std::memory_order_relaxed); }
  // Cheap, on every call: whether a sample was asked for. No clock read on the hot path.
  bool requested() const { return due_.load(std::memory_order_relaxed); }
  // Claims the requested sample for this thread; false if another thread claimed it first.
  bool claim() { return due_.exchange(false, std::memory_order_relaxed); }

  void record(int device, const UsageSample& s);
  UsageSample last(int device) const;

 private:
  std::atomic<bool> due_{false};
  mutable std::mutex mu_;
  UsageSample samples_[kMaxDevices];
};

}  // namespace gpushim
