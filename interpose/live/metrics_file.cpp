#include "live/metrics_file.h"

#include <cstring>

#include "live/prometheus_text.h"
#include "live/replace_file.h"
#include "util/log.h"

namespace gpushim {
namespace {
constexpr unsigned kMaxNotices = 5;
}

bool MetricsFile::write(const ProcessMetrics& m) {
  const int err = replace_file_atomically(path_, to_prometheus_text(m));
  if (err == 0) {
    failing_with_ = 0;
    return true;
  }
  if (err != failing_with_ && notices_ < kMaxNotices) {
    ++notices_;
    log_line("cannot update the metrics file %s: %s; retrying at every update%s", path_.c_str(), std::strerror(err),
             notices_ == kMaxNotices ? " (further metrics errors are not shown)" : "");
  }
  failing_with_ = err;
  return false;
}

}  // namespace gpushim
