#include "accounting/driver_usage.h"

namespace gpushim {

void DriverUsage::record(int device, const UsageSample& s) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard<std::mutex> lock(mu_);
  samples_[device] = s;
}

UsageSample DriverUsage::last(int device) const {
  if (device < 0 || device >= kMaxDevices) return {};
  std::lock_guard<std::mutex> lock(mu_);
  return samples_[device];
}

}  // namespace gpushim
