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

// A value quoted inside one line of ours (an input's own field, in an error): printable() and at
// most `max_bytes` long, "..." after the cut, which falls between two UTF-8 characters.
inline std::string excerpt(std::string_view s, size_t max_bytes = 80) {
  if (s.size() <= max_bytes) return printable(s);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // a continuation byte
  return printable(s.substr(0, cut)) + "...";
}

// "1 allocation", "2 allocations"; "1 entry", "2 entries" with the plural given.
inline std::string plural(uint64_t n, std::string_view word) {
  return std::to_string(n) + " " + std::string(word) + (n == 1 ? "" : "s");
}
inline std::string plural(uint64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

}  // namespace gpushim
