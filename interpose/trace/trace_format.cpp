#include "trace/trace_format.h"

#include <array>

namespace gpushim::trace {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

uint32_t read_u32le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void append_chunk(std::string* out, ChunkType type, std::string_view payload) {
  const size_t at = out->size();
  put_u32le(out, kChunkSync);
  put_u8(out, static_cast<uint8_t>(type));
  out->append(3, '\0');
  put_u32le(out, static_cast<uint32_t>(payload.size()));
  uint32_t crc = crc32(out->data() + at, kChunkCrcCovered);
  crc = crc32(payload.data(), payload.size(), crc);
  put_u32le(out, crc);
  out->append(payload.data(), payload.size());
}

bool parse_chunk_header(const uint8_t* p, ChunkHeader* out) {
  if (read_u32le(p) != kChunkSync) return false;
  if (p[5] != 0 || p[6] != 0 || p[7] != 0) return false;
  out->type = static_cast<ChunkType>(p[4]);
  out->length = read_u32le(p + 8);
  out->crc = read_u32le(p + 12);
  return out->length <= kMaxChunkPayload;
}

}  // namespace gpushim::trace
