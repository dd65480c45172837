#include "json.h"

#include <charconv>
#include <cstdlib>

namespace gpushim::analysis {

namespace {
constexpr int kMaxDepth = 128;  // reports nest 6 deep; anything far deeper is not ours

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  bool parse(JsonValue* out, std::string* error) {
    skip_ws();
    if (!value(out, 0)) return fail_out(error);
    skip_ws();
    if (i_ != s_.size()) {
      set_error("unexpected data after the document");
      return fail_out(error);
    }
    return true;
  }

 private:
  bool fail_out(std::string* error) {
    if (error) {
      size_t line = 1, col = 1;
      for (size_t k = 0; k < err_at_ && k < s_.size(); ++k) {
        if (s_[k] == '\n') ++line, col = 1;
        else ++col;
      }
      *error = "invalid JSON at line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + err_;
    }
    return false;
  }
  bool set_error(const char* msg) {
    if (err_.empty()) {
      err_ = msg;
      err_at_ = i_;
    }
    return false;
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(const char* word, size_t n) {
    if (s_.compare(i_, n, word) != 0) return set_error("unknown literal");
    i_ += n;
    return true;
  }

  bool value(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return set_error("nesting too deep");
    if (i_ >= s_.size()) return set_error("unexpected end of input");
    const char c = s_[i_];
    switch (c) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"':
        out->type_ = JsonValue::Type::kString;
        return string(&out->text_);
      case 't':
        out->type_ = JsonValue::Type::kBool;
        out->bool_ = true;
        return literal("true", 4);
      case 'f':
        out->type_ = JsonValue::Type::kBool;
        out->bool_ = false;
        return literal("false", 5);
      case 'n':
        out->type_ = JsonValue::Type::kNull;
        return literal("null", 4);
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return number(out);
        return set_error("unexpected character");
    }
  }

  bool object(JsonValue* out, int depth) {
    out->type_ = JsonValue::Type::kObject;
    ++i_;  // '{'
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != '"') return set_error("expected a member name");
      std::string key;
      if (!string(&key)) return false;
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != ':') return set_error("expected ':'");
      ++i_;
      skip_ws();
      out->object_.emplace_back(std::move(key), JsonValue());
      if (!value(&out->object_.back().second, depth + 1)) return false;
      skip_ws();
      if (i_ >= s_.size()) return set_error("unexpected end of input in an object");
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == '}') {
        ++i_;
        return true;
      }
      return set_error("expected ',' or '}'");
    }
  }

  bool array(JsonValue* out, int depth) {
    out->type_ = JsonValue::Type::kArray;
    ++i_;  // '['
    skip_ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      skip_ws();
      out->array_.emplace_back();
      if (!value(&out->array_.back(), depth + 1)) return false;
      skip_ws();
      if (i_ >= s_.size()) return set_error("unexpected end of input in an array");
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == ']') {
        ++i_;
        return true;
      }
      return set_error("expected ',' or ']'");
    }
  }

  bool hex4(uint32_t* v) {
    if (s_.size() - i_ < 4) return set_error("truncated \\u escape");
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      r <<= 4;
      if (c >= '0' && c <= '9') r |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') r |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') r |= static_cast<uint32_t>(c - 'A' + 10);
      else return set_error("bad \\u escape");
    }
    *v = r;
    return true;
  }

  bool string(std::string* out) {
    ++i_;  // opening quote
    for (;;) {
      if (i_ >= s_.size()) return set_error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c < 0x20) return set_error("control character in a string");
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++i_;
        continue;
      }
      ++i_;
      if (i_ >= s_.size()) return set_error("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by a low one; otherwise it stands for U+FFFD.
            uint32_t lo = 0;
            if (s_.size() - i_ >= 6 && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
              const size_t save = i_;
              i_ += 2;
              if (!hex4(&lo)) return false;
              if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              } else {
                i_ = save;
                cp = 0xFFFD;
              }
            } else {
              cp = 0xFFFD;
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            cp = 0xFFFD;
          }
          append_utf8(out, cp);
          break;
        }
        default: return set_error("unknown escape");
      }
    }
  }

  bool number(JsonValue* out) {
    const size_t start = i_;
    auto digit = [&] { return i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; };
    if (s_[i_] == '-') ++i_;
    if (!digit()) return set_error("expected a digit");
    if (s_[i_] == '0') {
      ++i_;
    } else {
      while (digit()) ++i_;
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digit()) return set_error("expected a digit after '.'");
      while (digit()) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digit()) return set_error("expected a digit in the exponent");
      while (digit()) ++i_;
    }
    out->type_ = JsonValue::Type::kNumber;
    out->text_.assign(s_, start, i_ - start);
    return true;
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string err_;
  size_t err_at_ = 0;
};

const JsonValue* JsonValue::get(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : object_)
    if (k == key) return &v;
  return nullptr;
}

bool JsonValue::to_u64(uint64_t* out) const {
  if (type_ != Type::kNumber) return false;
  const char* b = text_.data();
  const char* e = b + text_.size();
  uint64_t v = 0;
  auto r = std::from_chars(b, e, v);
  if (r.ec != std::errc() || r.ptr != e) return false;
  *out = v;
  return true;
}

bool JsonValue::to_i64(int64_t* out) const {
  if (type_ != Type::kNumber) return false;
  const char* b = text_.data();
  const char* e = b + text_.size();
  int64_t v = 0;
  auto r = std::from_chars(b, e, v);
  if (r.ec != std::errc() || r.ptr != e) return false;
  *out = v;
  return true;
}

bool JsonValue::to_double(double* out) const {
  if (type_ != Type::kNumber) return false;
  char* end = nullptr;
  const double v = std::strtod(text_.c_str(), &end);
  if (end != text_.c_str() + text_.size()) return false;
  *out = v;
  return true;
}

bool parse_json(const std::string& bytes, JsonValue* out, std::string* error) {
  JsonValue v;
  JsonParser p(bytes);
  if (!p.parse(&v, error)) return false;
  *out = std::move(v);
  return true;
}

}  // namespace gpushim::analysis
