#include "live/prometheus_text.h"

#include <charconv>
#include <cmath>

#include "util/utf8.h"

namespace gpushim {
namespace {

// A label value: backslash, double quote and newline escaped as the format says; bytes that are
// not UTF-8 become U+FFFD so that a strict parser never rejects the whole file.
void append_label_value(std::string& out, const std::string& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size();) {
    const char c = v[i];
    const char* escaped = c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : nullptr;
    if (escaped != nullptr) {
      out += escaped;
      ++i;
      continue;
    }
    const size_t len = utf8_sequence_length(p + i, v.size() - i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    out.append(v, i, len);
    i += len;
  }
}

void append_u64(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

void append_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buf[40];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

class Writer {
 public:
  explicit Writer(const ProcessIdentity& id) {
    process_labels_ = "host=\"";
    append_label_value(process_labels_, id.host);
    process_labels_ += "\",pid=\"";
    append_u64(process_labels_, static_cast<uint64_t>(id.pid));
    process_labels_ += "\",rank=\"";
    append_label_value(process_labels_, id.rank);
    process_labels_ += '"';
  }

  void family(const char* name, const char* type, const char* help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;  // our own text: no backslash or newline to escape
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
  }
  // One sample with the process labels plus `extra` (already formatted, may be empty).
  void sample_start(const char* name, const std::string& extra) {
    out += name;
    out += '{';
    out += process_labels_;
    if (!extra.empty()) {
      out += ',';
      out += extra;
    }
    out += "} ";
  }
  void sample(const char* name, const std::string& extra, uint64_t v) {
    sample_start(name, extra);
    append_u64(out, v);
    out += '\n';
  }
  void sample(const char* name, const std::string& extra, double v) {
    sample_start(name, extra);
    append_double(out, v);
    out += '\n';
  }

  std::string out;

 private:
  std::string process_labels_;
};

struct DeviceFamily {
  const char* name;
  const char* type;
  const char* help;
  std::optional<uint64_t> (*value)(const DeviceMetrics&);
};

// Order and wording are part of the format (docs/metrics-and-snapshots.md). HELP texts must stay
// identical across versions: node_exporter refuses to merge files whose HELP for a name differs.
const DeviceFamily kDeviceFamilies[] = {
    {"gpushim_allocated_bytes", "gauge",
     "Device memory allocated to the program and not yet freed, in bytes as handed out (rounded by the policy).",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.live_bytes; }},
    {"gpushim_reserved_bytes", "gauge",
     "Device memory the process holds from the driver through gpushim, in bytes (allocated plus the pool's cache).",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.reserved_bytes; }},
    {"gpushim_peak_allocated_bytes", "gauge", "Highest gpushim_allocated_bytes since the process started.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.peak_bytes; }},
    {"gpushim_peak_reserved_bytes", "gauge", "Highest gpushim_reserved_bytes since the process started.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.peak_reserved_bytes; }},
    {"gpushim_cap_bytes", "gauge",
     "Most device memory this process may hold: GPUSHIM_LIMIT when set (at most the capacity), else the device "
     "capacity.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> {
       if (d.cap_bytes() == 0) return std::nullopt;
       return d.cap_bytes();
     }},
    {"gpushim_capacity_bytes", "gauge", "Total memory of the device as the driver reports it.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> {
       if (d.capacity_bytes == 0) return std::nullopt;
       return d.capacity_bytes;
     }},
    {"gpushim_unaccounted_bytes", "gauge",
     "Device memory the process uses that no gpushim hook saw (CUDA context, module images), in bytes.",
     [](const DeviceMetrics& d) { return d.unaccounted_bytes; }},
    {"gpushim_live_allocations", "gauge", "Device allocations live now.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.live_count; }},
    {"gpushim_allocations_total", "counter", "Successful device allocations since the process started.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.total_allocs; }},
    {"gpushim_frees_total", "counter", "Device frees since the process started.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.total_frees; }},
    {"gpushim_failed_allocations_total", "counter",
     "Device allocation calls that failed (out of memory, over GPUSHIM_LIMIT, driver errors).",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.failed_allocations; }},
    {"gpushim_ooms_total", "counter",
     "Out-of-memory errors returned to the program, by the device or by GPUSHIM_LIMIT.",
     [](const DeviceMetrics& d) -> std::optional<uint64_t> { return d.ooms; }},
};

}  // namespace

std::string to_prometheus_text(const ProcessMetrics& m) {
  Writer w(m.id);
  w.out.reserve(4096 + m.devices.size() * 1024);

  std::string info = "exe=\"";
  append_label_value(info, m.id.exe_name);
  info += "\",policy=\"";
  append_label_value(info, m.id.policy);
  info += '"';
  w.family("gpushim_info", "gauge", "Always 1; labels say which program and policy the process runs.");
  w.sample("gpushim_info", info, uint64_t{1});
  w.family("gpushim_running", "gauge", "1 while the process runs; 0 in the last update, written at exit.");
  w.sample("gpushim_running", "", uint64_t{m.running ? 1u : 0u});
  w.family("gpushim_start_time_seconds", "gauge",
           "When gpushim started in this process (its first CUDA call), seconds since the Unix epoch.");
  w.sample("gpushim_start_time_seconds", "", m.start_time_s);
  w.family("gpushim_snapshots_total", "counter", "Snapshot reports written on request (signal).");
  w.sample("gpushim_snapshots_total", "", m.snapshots);

  std::vector<std::string> device_labels;
  for (const DeviceMetrics& d : m.devices) {
    std::string l = "device=\"";
    append_u64(l, static_cast<uint64_t>(d.device));
    l += '"';
    device_labels.push_back(std::move(l));
  }
  for (const DeviceFamily& f : kDeviceFamilies) {
    bool any = false;
    for (const DeviceMetrics& d : m.devices) any = any || f.value(d).has_value();
    if (!any) continue;
    w.family(f.name, f.type, f.help);
    for (size_t i = 0; i < m.devices.size(); ++i)
      if (const std::optional<uint64_t> v = f.value(m.devices[i])) w.sample(f.name, device_labels[i], *v);
  }
  return std::move(w.out);
}

}  // namespace gpushim
