// Reading gzip-compressed reports and traces as they are (bench/traces ships its traces as
// .trace.gz, and people compress what they keep): read_file (run_view.h) decompresses as it reads,
// so the input's own bounds (early refusal, size limit) apply to what is decompressed.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpushim::analysis {

// gzip's magic and deflate's method byte: what a stream must begin with to be taken for gzip.
bool looks_like_gzip(const char* head, size_t n);

// One gzip file (several members in a row, as `cat a.gz b.gz` makes, included), decompressed
// incrementally. Bytes after the last member that do not begin another are ignored, as gzip(1)
// does with a warning.
class GzipInput {
 public:
  GzipInput();
  ~GzipInput();
  GzipInput(const GzipInput&) = delete;
  GzipInput& operator=(const GzipInput&) = delete;

  // Decompresses `n` more bytes onto `out`; false with a one-line `error` on data that is not
  // gzip, or when `out` would pass `limit` bytes (then `too_large` is set).
  bool feed(const char* data, size_t n, uint64_t limit, std::string* out, std::string* error, bool* too_large);
  // Whether the input so far ends where a member ends (not cut short).
  bool complete() const { return started_ && at_member_end_; }

 private:
  z_stream z_{};
  bool ok_ = false;
  bool started_ = false;
  bool at_member_end_ = false;
  bool trailing_ = false;  // past the last member: the rest is ignored
};

}  // namespace gpushim::analysis
