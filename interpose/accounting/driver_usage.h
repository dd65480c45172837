// What the driver says a device has in use (cuMemGetInfo: total - free), sampled next to what we
// saw the process hold on that device at the same instant, so the report can show "unaccounted"
// memory: context, module images, local memory, the device heap, the driver's rounding.
//
// Samples are taken on the allocating thread, at most once per interval (and right away for a
// device seen for the first time), never at exit: calling CUDA from exit handlers is unsafe.
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

  explicit DriverUsage(uint64_t interval_ns) : interval_ns_(interval_ns) {}

  // Cheap: whether a sample is due (the interval passed, or a new device asked for one).
  bool due(uint64_t now_ns) const { return now_ns >= next_due_ns_.load(std::memory_order_relaxed); }
  // Claims the due sample for this thread; false if another thread claimed it first.
  bool claim(uint64_t now_ns) {
    uint64_t due = next_due_ns_.load(std::memory_order_relaxed);
    return now_ns >= due && next_due_ns_.compare_exchange_strong(due, now_ns + interval_ns_, std::memory_order_relaxed);
  }
  // The next opportunity samples (a device was just seen for the first time).
  void request() { next_due_ns_.store(0, std::memory_order_relaxed); }

  void record(int device, const UsageSample& s);
  UsageSample last(int device) const;

 private:
  const uint64_t interval_ns_;
  std::atomic<uint64_t> next_due_ns_{0};
  mutable std::mutex mu_;
  UsageSample samples_[kMaxDevices];
};

}  // namespace gpushim
