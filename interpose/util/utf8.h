// The one UTF-8 validator, for every writer whose format requires UTF-8 (JSON documents, the
// Prometheus text format): symbol names, paths, host and program names are raw bytes.
#pragma once

#include <cstddef>

namespace gpushim {

// Length of the well-formed UTF-8 sequence at p (n bytes left, n > 0), or 0 if the byte there does
// not start one. Well-formed as RFC 3629 says: no overlongs, no UTF-16 surrogates, nothing past
// U+10FFFF. An ASCII byte is a sequence of 1.
inline size_t utf8_sequence_length(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  const size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  for (size_t i = 1; i < len; ++i)
    if ((p[i] & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && p[1] < 0xA0) return 0;  // overlong
  if (c == 0xED && p[1] > 0x9F) return 0;  // UTF-16 surrogate
  if (c == 0xF0 && p[1] < 0x90) return 0;  // overlong
  if (c == 0xF4 && p[1] > 0x8F) return 0;  // above U+10FFFF
  return len;
}

}  // namespace gpushim
