#include "python/line_table.h"

namespace gpushim {
namespace {

// 3.9 co_lnotab (Objects/lnotab_notes.txt): pairs (unsigned byte delta, signed line delta); the
// line of an offset is the sum of the line deltas of every pair whose address is <= it.
int lnotab_line(std::string_view t, int first_line, int offset) {
  int line = first_line;
  int addr = 0;
  for (size_t i = 0; i + 1 < t.size(); i += 2) {
    addr += static_cast<unsigned char>(t[i]);
    if (addr > offset) break;
    line += static_cast<signed char>(t[i + 1]);
  }
  return line;
}

// 3.10 co_linetable (PEP 626): pairs (unsigned byte length of a range, signed line delta; -128:
// the range has no line). Zero-length ranges only carry line deltas.
int linetable310_line(std::string_view t, int first_line, int offset) {
  int line = first_line;
  int start = 0;
  for (size_t i = 0; i + 1 < t.size(); i += 2) {
    const int end = start + static_cast<unsigned char>(t[i]);
    const int delta = static_cast<signed char>(t[i + 1]);
    const bool has_line = delta != -128;
    if (has_line) line += delta;
    if (start <= offset && offset < end) return has_line ? line : 0;
    start = end;
  }
  return 0;
}

// 3.11+ location table (Objects/locations.md): each entry starts with a byte 1CCCCLLL (code C,
// length L+1 code units) followed by varints whose meaning depends on the code.
class LocationReader {
 public:
  explicit LocationReader(std::string_view t) : t_(t) {}
  bool at_end() const { return pos_ >= t_.size(); }
  uint8_t byte() { return pos_ < t_.size() ? static_cast<uint8_t>(t_[pos_++]) : 0; }
  // 6-bit groups, least significant first, bit 6 = more follow.
  unsigned varint() {
    unsigned b = byte();
    unsigned v = b & 63;
    unsigned shift = 0;
    while ((b & 64) && shift < 30 && !at_end()) {
      b = byte();
      shift += 6;
      v |= (b & 63) << shift;
    }
    return v;
  }
  int svarint() {
    const unsigned u = varint();
    return (u & 1) ? -static_cast<int>(u >> 1) : static_cast<int>(u >> 1);
  }
  void skip_to_next_entry() {
    while (pos_ < t_.size() && (static_cast<uint8_t>(t_[pos_]) & 128) == 0) ++pos_;
  }

 private:
  std::string_view t_;
  size_t pos_ = 0;
};

int locations311_line(std::string_view t, int first_line, int offset) {
  LocationReader r(t);
  int line = first_line;
  int start = 0;
  while (!r.at_end()) {
    const uint8_t head = r.byte();
    if ((head & 128) == 0) return 0;  // not an entry start: malformed
    const int code = (head >> 3) & 15;
    const int end = start + ((head & 7) + 1) * 2;  // code units are 2 bytes
    bool has_line = true;
    switch (code) {
      case 15: has_line = false; break;                  // no location
      case 14: line += r.svarint(); break;               // long form (end line, columns follow)
      case 13: line += r.svarint(); break;               // no columns
      case 12: line += 2; break;                         // one-line forms: delta 2, 1, 0
      case 11: line += 1; break;
      default: break;                                    // 10 and the short forms 0-9: same line
    }
    r.skip_to_next_entry();
    if (start <= offset && offset < end) return has_line ? line : 0;
    start = end;
  }
  return 0;
}

}  // namespace

int python_line_for_offset(LineTableFormat format, std::string_view table, int first_line, int byte_offset) {
  if (byte_offset < 0) return first_line;
  switch (format) {
    case LineTableFormat::kLnotab39: return lnotab_line(table, first_line, byte_offset);
    case LineTableFormat::kLinetable310: return linetable310_line(table, first_line, byte_offset);
    case LineTableFormat::kLocations311: return locations311_line(table, first_line, byte_offset);
  }
  return 0;
}

}  // namespace gpushim
