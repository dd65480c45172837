#include "gzip_input.h"

namespace gpushim::analysis {

bool looks_like_gzip(const char* head, size_t n) {
  return n >= 3 && static_cast<unsigned char>(head[0]) == 0x1f && static_cast<unsigned char>(head[1]) == 0x8b &&
         head[2] == 8;
}

GzipInput::GzipInput() { ok_ = inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK; }  // 16: gzip wrapper only

GzipInput::~GzipInput() {
  if (ok_) inflateEnd(&z_);
}

bool GzipInput::feed(const char* data, size_t n, uint64_t limit, std::string* out, std::string* error,
                     bool* too_large) {
  *too_large = false;
  if (!ok_) {
    *error = "cannot start zlib's decompressor";
    return false;
  }
  z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
  z_.avail_in = static_cast<uInt>(n);
  char buf[1 << 16];
  while (z_.avail_in > 0 && !trailing_) {
    if (at_member_end_) {
      // Another member follows, or what follows is not gzip and ends the file.
      if (!looks_like_gzip(reinterpret_cast<const char*>(z_.next_in), z_.avail_in) &&
          !(z_.avail_in < 3 && static_cast<unsigned char>(z_.next_in[0]) == 0x1f)) {
        trailing_ = true;
        break;
      }
      inflateReset(&z_);
      at_member_end_ = false;
    }
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = sizeof buf;
    const int r = inflate(&z_, Z_NO_FLUSH);
    const size_t produced = sizeof buf - z_.avail_out;
    if (r == Z_OK || r == Z_STREAM_END || r == Z_BUF_ERROR) started_ = true;
    if (out->size() + produced > limit) {
      *too_large = true;
      return false;
    }
    out->append(buf, produced);
    if (r == Z_STREAM_END) {
      at_member_end_ = true;
    } else if (r == Z_BUF_ERROR) {
      if (produced == 0) break;  // needs more input
    } else if (r != Z_OK) {
      *error = std::string("damaged gzip data (zlib: ") + (z_.msg ? z_.msg : "error " + std::to_string(r)) + ")";
      return false;
    }
  }
  return true;
}

}  // namespace gpushim::analysis
