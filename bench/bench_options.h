// Option parsing shared by the benchmarks that take our own --name=value options before Google
// Benchmark's (alloc_bench, rmm_bench): comma lists, and the size labels in benchmark names, which
// must read the same in both so that their rows line up (pair/<api>/fixed_4KiB).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace gpushim_bench {

// The value of `arg` when it starts with `name` ("--sizes="): what follows the name; else nullptr.
inline const char* option_value(const char* arg, const char* name) {
  const size_t n = std::strlen(name);
  return std::strncmp(arg, name, n) == 0 ? arg + n : nullptr;
}

// "4096,,1048576" -> {"4096", "1048576"}: empty parts are dropped.
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// 4096 -> "4KiB", 1048576 -> "1MiB", 1000 -> "1000B".
inline std::string size_label(size_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + "MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "KiB";
  return std::to_string(n) + "B";
}

}  // namespace gpushim_bench
