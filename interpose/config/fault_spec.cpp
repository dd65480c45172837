#include "config/fault_spec.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "util/units.h"

namespace gpushim {
namespace {

// More nth clauses than this is a list nobody types by hand; refusing keeps the check cheap.
constexpr size_t kMaxNth = 64;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// A positive decimal integer, no sign, no junk, at most UINT64_MAX.
bool parse_count(std::string_view s, uint64_t* out) {
  s = trim(s);
  if (s.empty() || s.size() > 20) return false;
  unsigned __int128 v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (v == 0 || v > UINT64_MAX) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

// A probability in (0, 1] written as a plain decimal ("0.01", "1", ".5" is refused like in bytes).
bool parse_probability(std::string_view s, double* out) {
  s = trim(s);
  if (s.empty() || s.size() > 32 || s[0] < '0' || s[0] > '9') return false;
  bool dot = false;
  for (char c : s) {
    if (c == '.' && !dot) dot = true;
    else if (c < '0' || c > '9') return false;
  }
  if (s.back() == '.') return false;
  const std::string copy(s);
  const double p = std::strtod(copy.c_str(), nullptr);
  if (!(p > 0) || p > 1 || !std::isfinite(p)) return false;
  *out = p;
  return true;
}

}  // namespace

bool parse_fault_spec(std::string_view text, FaultSpec* out) {
  const std::string_view whole = trim(text);
  const std::string low = lower(whole);
  if (low == "off" || low == "none" || low == "0") {
    *out = FaultSpec{};
    out->text = "off";
    return true;
  }
  if (whole.empty()) return false;
  FaultSpec spec;
  bool seed_given = false;
  size_t start = 0;
  while (start <= whole.size()) {
    size_t comma = whole.find(',', start);
    if (comma == std::string_view::npos) comma = whole.size();
    const std::string_view clause = trim(whole.substr(start, comma - start));
    start = comma + 1;
    const size_t colon = clause.find(':');
    if (colon == std::string_view::npos) return false;
    const std::string key = lower(trim(clause.substr(0, colon)));
    const std::string_view value = clause.substr(colon + 1);
    if (key == "nth") {
      uint64_t n = 0;
      if (!parse_count(value, &n) || spec.nth.size() == kMaxNth) return false;
      spec.nth.push_back(n);
    } else if (key == "every") {
      if (spec.every != 0 || !parse_count(value, &spec.every)) return false;
    } else if (key == "random") {
      if (spec.probability > 0 || !parse_probability(value, &spec.probability)) return false;
    } else if (key == "seed") {
      uint64_t s = 0;
      // 0 is a fine seed; parse_count refuses it, so accept it explicitly.
      if (seed_given) return false;
      if (trim(value) == "0") s = 0;
      else if (!parse_count(value, &s)) return false;
      spec.seed = s;
      seed_given = true;
    } else if (key == "above") {
      if (spec.above != UINT64_MAX || !parse_bytes(value, &spec.above) || spec.above == UINT64_MAX) return false;
    } else {
      return false;
    }
  }
  // A seed alone selects nothing: almost certainly a mistake, so say so rather than do nothing.
  if (!spec.active()) return false;
  if (seed_given && spec.probability == 0) return false;
  spec.text = std::string(whole);
  *out = std::move(spec);
  return true;
}

}  // namespace gpushim
