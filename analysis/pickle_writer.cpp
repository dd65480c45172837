#include "pickle_writer.h"

#include <cstring>

namespace gpushim::analysis {
namespace {

// Opcodes (CPython Lib/pickletools.py).
constexpr char PROTO = '\x80';
constexpr char STOP = '.';
constexpr char NONE = 'N';
constexpr char NEWTRUE = '\x88';
constexpr char NEWFALSE = '\x89';
constexpr char BININT = 'J';
constexpr char BININT1 = 'K';
constexpr char BININT2 = 'M';
constexpr char LONG1 = '\x8a';
constexpr char BINFLOAT = 'G';
constexpr char SHORT_BINUNICODE = '\x8c';
constexpr char BINUNICODE = 'X';
constexpr char EMPTY_DICT = '}';
constexpr char EMPTY_LIST = ']';
constexpr char MARK = '(';
constexpr char SETITEMS = 'u';
constexpr char APPENDS = 'e';
constexpr char MEMOIZE = '\x94';
constexpr char BINGET = 'h';
constexpr char LONG_BINGET = 'j';

constexpr uint32_t kBatch = 1000;

void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// The UTF-8 text of `s`, with every byte that does not start a well-formed sequence replaced by
// U+FFFD (symbol names and paths are raw bytes; unpicklers decode strictly).
std::string clean_utf8(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
    size_t len = 0;
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF && cont(1)) len = 2;
    else if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2) && !(c == 0xE0 && p[i + 1] < 0xA0) &&
             !(c == 0xED && p[i + 1] > 0x9F))
      len = 3;
    else if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3) && !(c == 0xF0 && p[i + 1] < 0x90) &&
             !(c == 0xF4 && p[i + 1] > 0x8F))
      len = 4;
    if (len == 0) {
      r += "\xEF\xBF\xBD";
      ++i;
    } else {
      r.append(s.data() + i, len);
      i += len;
    }
  }
  return r;
}

}  // namespace

PickleWriter::PickleWriter() {
  out_.push_back(PROTO);
  out_.push_back(4);
}

void PickleWriter::pushed() {
  if (levels_.empty()) return;
  Level& l = levels_.back();
  ++l.items;
  // A dict flushes only between pairs.
  if (l.items >= (l.dict ? 2 * kBatch : kBatch) && (!l.dict || l.items % 2 == 0)) {
    flush_level();
    out_.push_back(MARK);
  }
}

void PickleWriter::flush_level() {
  Level& l = levels_.back();
  out_.push_back(l.dict ? SETITEMS : APPENDS);
  l.items = 0;
}

void PickleWriter::none() {
  out_.push_back(NONE);
  pushed();
}

void PickleWriter::boolean(bool v) {
  out_.push_back(v ? NEWTRUE : NEWFALSE);
  pushed();
}

void PickleWriter::integer(int64_t v) {
  if (v >= 0 && v < 256) {
    out_.push_back(BININT1);
    put_le(&out_, static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    out_.push_back(BININT2);
    put_le(&out_, static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back(BININT);
    put_le(&out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
  } else {
    // LONG1: little-endian two's complement, as few bytes as keep the sign.
    int n = 8;
    while (n > 1) {
      const int64_t top = v >> (8 * (n - 1) - 1);  // the byte that would go, plus the sign bit below it
      if (top != 0 && top != -1) break;
      --n;
    }
    out_.push_back(LONG1);
    out_.push_back(static_cast<char>(n));
    put_le(&out_, static_cast<uint64_t>(v), n);
  }
  pushed();
}

void PickleWriter::unsigned_integer(uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return integer(static_cast<int64_t>(v));
  // Needs a ninth byte so that the top bit is not taken as a sign.
  out_.push_back(LONG1);
  out_.push_back(9);
  put_le(&out_, v, 8);
  out_.push_back(0);
  pushed();
}

void PickleWriter::real(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  out_.push_back(BINFLOAT);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));  // big-endian
  pushed();
}

void PickleWriter::string(std::string_view s) {
  const std::string u = clean_utf8(s);
  if (u.size() < 256) {
    out_.push_back(SHORT_BINUNICODE);
    out_.push_back(static_cast<char>(u.size()));
  } else {
    out_.push_back(BINUNICODE);
    put_le(&out_, u.size(), 4);
  }
  out_ += u;
  pushed();
}

void PickleWriter::interned(std::string_view s) {
  auto it = strings_.find(std::string(s));
  if (it != strings_.end()) return get(it->second);
  string(s);
  strings_.emplace(std::string(s), memoize());
}

void PickleWriter::begin_dict() {
  out_.push_back(EMPTY_DICT);
  out_.push_back(MARK);
  levels_.push_back(Level{true, 0});
}

void PickleWriter::begin_list() {
  out_.push_back(EMPTY_LIST);
  out_.push_back(MARK);
  levels_.push_back(Level{false, 0});
}

void PickleWriter::end_dict() {
  flush_level();
  levels_.pop_back();
  pushed();
}

void PickleWriter::end_list() { end_dict(); }

uint32_t PickleWriter::memoize() {
  out_.push_back(MEMOIZE);
  return next_memo_++;
}

void PickleWriter::get(uint32_t i) {
  if (i < 256) {
    out_.push_back(BINGET);
    out_.push_back(static_cast<char>(i));
  } else {
    out_.push_back(LONG_BINGET);
    put_le(&out_, i, 4);
  }
  pushed();
}

std::string PickleWriter::finish() {
  out_.push_back(STOP);
  return std::move(out_);
}

}  // namespace gpushim::analysis
