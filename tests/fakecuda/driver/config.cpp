#include "config.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace fakecuda {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::optional<double> UnitMultiplier(std::string_view unit) {
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr double kKi = 1024.0;
  static constexpr Unit kUnits[] = {
      {"", 1},          {"b", 1},
      {"k", kKi},       {"ki", kKi},       {"kib", kKi},       {"kb", 1e3},
      {"m", kKi * kKi}, {"mi", kKi * kKi}, {"mib", kKi * kKi}, {"mb", 1e6},
      {"g", kKi * kKi * kKi}, {"gi", kKi * kKi * kKi}, {"gib", kKi * kKi * kKi}, {"gb", 1e9},
      {"t", kKi * kKi * kKi * kKi}, {"ti", kKi * kKi * kKi * kKi}, {"tib", kKi * kKi * kKi * kKi}, {"tb", 1e12},
  };
  for (const Unit& u : kUnits) {
    if (EqualsNoCase(unit, u.name)) return u.factor;
  }
  return std::nullopt;
}

}  // namespace

std::optional<long long> ParseInt(std::string_view text) {
  text = Trim(text);
  if (text.empty() || text.size() > 18) return std::nullopt;
  long long value = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::optional<std::size_t> ParseSize(std::string_view text) {
  text = Trim(text);
  std::size_t digits_end = 0;
  bool seen_dot = false;
  while (digits_end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits_end])) || (!seen_dot && text[digits_end] == '.'))) {
    seen_dot = seen_dot || text[digits_end] == '.';
    ++digits_end;
  }
  std::string_view number = text.substr(0, digits_end);
  if (number.empty() || number == ".") return std::nullopt;
  std::optional<double> factor = UnitMultiplier(Trim(text.substr(digits_end)));
  if (!factor) return std::nullopt;

  if (!seen_dot) {
    // Integers go through exact arithmetic so that large byte counts do not lose precision.
    std::optional<long long> n = ParseInt(number);
    if (!n) return std::nullopt;
    const auto whole = static_cast<unsigned long long>(*n);
    const auto mult = static_cast<unsigned long long>(*factor);
    if (mult != 0 && whole > std::numeric_limits<std::size_t>::max() / mult) return std::nullopt;
    return static_cast<std::size_t>(whole * mult);
  }
  const double value = std::strtod(std::string(number).c_str(), nullptr) * *factor;
  if (!std::isfinite(value) || value < 0 || value >= 1.8e19) return std::nullopt;
  return static_cast<std::size_t>(std::llround(value));
}

std::optional<std::set<std::uint64_t>> ParseIndexList(std::string_view text) {
  std::set<std::uint64_t> out;
  while (true) {
    const std::size_t comma = text.find(',');
    std::optional<long long> n = ParseInt(text.substr(0, comma));
    if (!n || *n <= 0) return std::nullopt;
    out.insert(static_cast<std::uint64_t>(*n));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

Config LoadConfig(EnvLookup lookup, std::string* err) {
  Config cfg;
  auto complain = [&](const char* var, const char* value, const char* why) {
    if (err == nullptr) return;
    *err += "fakecuda: ignoring ";
    *err += var;
    *err += "=\"";
    *err += value;
    *err += "\": ";
    *err += why;
    *err += "\n";
  };

  if (const char* v = lookup("FAKECUDA_DEVICES")) {
    std::optional<long long> n = ParseInt(v);
    if (n && *n >= 1 && *n <= kMaxDevices) {
      cfg.devices = static_cast<int>(*n);
    } else {
      complain("FAKECUDA_DEVICES", v, "expected an integer from 1 to 64; using 1");
    }
  }
  if (const char* v = lookup("FAKECUDA_MEM")) {
    std::optional<std::size_t> n = ParseSize(v);
    // At least one VMM granule, and at most 1 TiB of address space per device.
    if (n && *n >= (std::size_t{2} << 20) && *n <= (std::size_t{1} << 40)) {
      cfg.capacity = *n;
    } else {
      complain("FAKECUDA_MEM", v, "expected a size from 2MiB to 1TiB such as 16GiB, 512MiB, 1G or 4096; using 16GiB");
    }
  }
  if (const char* v = lookup("FAKECUDA_FAIL_ALLOC")) {
    std::optional<std::set<std::uint64_t>> list = ParseIndexList(v);
    if (list) {
      cfg.fail_alloc = std::move(*list);
    } else {
      complain("FAKECUDA_FAIL_ALLOC", v, "expected 1-based call numbers such as 3 or 3,7; no allocation fails");
    }
  }
  if (const char* v = lookup("FAKECUDA_CONTEXT_MEM")) {
    std::optional<std::size_t> n = ParseSize(v);
    if (n) {
      cfg.context_mem = *n;
    } else {
      complain("FAKECUDA_CONTEXT_MEM", v, "expected a size such as 300MiB; using 0");
    }
  }
  if (const char* v = lookup("FAKECUDA_BROKEN_EVENTS")) {
    if (std::string_view(v) == "1") {
      cfg.broken_events = true;
    } else if (std::string_view(v) != "0") {
      complain("FAKECUDA_BROKEN_EVENTS", v, "expected 0 or 1; using 0");
    }
  }
  if (const char* v = lookup("FAKECUDA_KERNEL_US")) {
    std::optional<long long> n = std::string_view(v) == "0" ? std::optional<long long>(0) : ParseInt(v);
    if (n && *n >= 0 && *n <= 1000000) {
      cfg.kernel_us = static_cast<unsigned>(*n);
    } else {
      complain("FAKECUDA_KERNEL_US", v, "expected microseconds from 0 to 1000000; using 20");
    }
  }
  if (const char* v = lookup("FAKECUDA_ALLOC_ORDER")) {
    if (std::string_view(v) == "down") {
      cfg.alloc_top_down = true;
    } else if (std::string_view(v) != "up") {
      complain("FAKECUDA_ALLOC_ORDER", v, "expected up or down; using up");
    }
  }
  return cfg;
}

const Config& GetConfig() {
  // Function-local static: initialised once, thread-safely, on first use (never from a global
  // constructor). Deliberately leaked so that worker threads may still read it during exit().
  static const Config* config = [] {
    std::string err;
    auto* cfg = new Config(LoadConfig([](const char* name) -> const char* { return std::getenv(name); }, &err));
    if (!err.empty()) std::fputs(err.c_str(), stderr);
    return cfg;
  }();
  return *config;
}

}  // namespace fakecuda
