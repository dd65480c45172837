// Words in one line of text, written once for the shim's own summary (report/) and for
// gpushim-analyze (analysis/), which print the same names and counts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gpushim {

// `s` with every control byte as '?': a name from a program's symbols, paths or a damaged input
// may hold anything, and a line of ours stays one line that leaves the terminal as it was (no
// escape sequences, no bell). UTF-8 is text and stays.
inline std::string printable(std::string_view s) {
  std::string r(s);
  for (char& c : r)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = '?';
  return r;
}

// "1 allocation", "2 allocations"; "1 entry", "2 entries" with the plural given.
inline std::string plural(uint64_t n, std::string_view word) {
  return std::to_string(n) + " " + std::string(word) + (n == 1 ? "" : "s");
}
inline std::string plural(uint64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

}  // namespace gpushim
