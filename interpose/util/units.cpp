#include "util/units.h"

#include <cstdio>

namespace gpushim {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Multiplier for a unit suffix (already lower-cased, no surrounding space); 0 if unknown.
uint64_t unit_multiplier(std::string_view u) {
  if (u.empty() || u == "b") return 1;
  static constexpr struct {
    char letter;
    uint64_t binary;
    uint64_t decimal;
  } kUnits[] = {
      {'k', 1ull << 10, 1000ull},
      {'m', 1ull << 20, 1000ull * 1000},
      {'g', 1ull << 30, 1000ull * 1000 * 1000},
      {'t', 1ull << 40, 1000ull * 1000 * 1000 * 1000},
  };
  for (const auto& e : kUnits) {
    if (u[0] != e.letter) continue;
    const std::string_view rest = u.substr(1);
    if (rest.empty() || rest == "i" || rest == "ib") return e.binary;
    if (rest == "b") return e.decimal;
    return 0;
  }
  return 0;
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  size_t u = 0;
  // Promote when rounding to one decimal would print "1024.0" of the smaller unit.
  while (v >= 1023.95 && u + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

bool parse_bytes(std::string_view text, uint64_t* out) {
  size_t b = 0, e = text.size();
  while (b < e && is_space(text[b])) ++b;
  while (e > b && is_space(text[e - 1])) --e;
  const std::string_view s = text.substr(b, e - b);

  size_t i = 0;
  if (i >= s.size() || !is_digit(s[i])) return false;  // also rejects "", "-1", "+1", ".5"
  unsigned __int128 whole = 0;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > UINT64_MAX) return false;
  }
  uint64_t frac = 0, frac_scale = 1;
  bool has_frac = false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    size_t digits = 0;
    for (; i < s.size() && is_digit(s[i]); ++i, ++digits) {
      if (digits == 18) return false;  // 10^18 is the largest power of ten below 2^64
      frac = frac * 10 + static_cast<unsigned>(s[i] - '0');
      frac_scale *= 10;
    }
    if (digits == 0) return false;
    has_frac = true;
  }
  while (i < s.size() && is_space(s[i])) ++i;

  char unit[4];
  size_t ulen = 0;
  for (; i < s.size(); ++i) {
    if (ulen == sizeof(unit)) return false;
    unit[ulen++] = lower(s[i]);
  }
  const uint64_t mult = unit_multiplier(std::string_view(unit, ulen));
  if (mult == 0) return false;
  if (has_frac && mult == 1) return false;  // bytes are whole

  // whole < 2^64 and mult <= 2^40, frac < 10^18 < 2^60: every product fits in 128 bits.
  unsigned __int128 total = whole * mult;
  if (total > UINT64_MAX) return false;
  if (has_frac) {
    total += static_cast<unsigned __int128>(frac) * mult / frac_scale;
    if (total > UINT64_MAX) return false;
  }
  *out = static_cast<uint64_t>(total);
  return true;
}

}  // namespace gpushim
