#include "json.h"

#include <exception>

#include <nlohmann/json.hpp>

#include "util/utf8.h"

namespace gpushim::analysis {

namespace {
constexpr size_t kMaxDepth = 128;  // reports nest 6 deep; anything far deeper is not ours

// "invalid JSON at line L, column C: what" for the byte at `offset`.
std::string located(const std::string& s, size_t offset, const std::string& what) {
  size_t line = 1, col = 1;
  for (size_t k = 0; k < offset && k < s.size(); ++k) {
    if (s[k] == '\n') ++line, col = 1;
    else ++col;
  }
  return "invalid JSON at line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what;
}

// Where the (kMaxDepth + 1)-th open container starts: the parser refused it there, and its SAX
// callbacks carry no position. Everything before is valid JSON, so strings are the only thing to skip.
size_t offset_of_too_deep(const std::string& s) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (in_string) {
      if (c == '\\') ++k;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return k;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return s.size();
}
// `s` with every byte that does not start well-formed UTF-8 replaced by U+FFFD, or false if there
// is none (the usual case: every writer of ours writes UTF-8).
bool replace_invalid_utf8(const std::string& s, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size() && utf8_sequence_length(p + i, s.size() - i) != 0) i += utf8_sequence_length(p + i, s.size() - i);
  if (i == s.size()) return false;
  out->assign(s, 0, i);
  while (i < s.size()) {
    const size_t len = utf8_sequence_length(p + i, s.size() - i);
    if (len == 0) {
      *out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out->append(s, i, len);
      i += len;
    }
  }
  return true;
}
}  // namespace

// Builds a JsonValue from the parser's SAX events. Containers are filled in place: a container's
// address is stable while it is open, since its parent only grows after it closes.
class JsonBuilder {
 public:
  using json = nlohmann::json;
  explicit JsonBuilder(JsonValue* root) : root_(root) {}

  bool null() { return add() != nullptr; }
  bool boolean(bool b) {
    JsonValue* v = add();
    v->type_ = JsonValue::Type::kBool;
    v->bool_ = b;
    return true;
  }
  bool number_integer(json::number_integer_t n) {
    JsonValue* v = number(JsonValue::Number::kSigned);
    v->i64_ = n;
    return true;
  }
  bool number_unsigned(json::number_unsigned_t n) {
    JsonValue* v = number(JsonValue::Number::kUnsigned);
    v->u64_ = n;
    return true;
  }
  bool number_float(json::number_float_t f, const json::string_t&) {
    number(JsonValue::Number::kFloat)->f64_ = f;
    return true;
  }
  bool string(json::string_t& s) {
    JsonValue* v = add();
    v->type_ = JsonValue::Type::kString;
    v->text_ = std::move(s);
    return true;
  }
  bool binary(json::binary_t&) { return false; }  // not produced by the JSON parser
  bool start_object(size_t) { return open(JsonValue::Type::kObject); }
  bool key(json::string_t& k) {
    open_.back()->object_.emplace_back(std::move(k), JsonValue());
    return true;
  }
  bool end_object() {
    open_.pop_back();
    return true;
  }
  bool start_array(size_t) { return open(JsonValue::Type::kArray); }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    // what() is "[json.exception.parse_error.N] parse error at line L, column C: <what went wrong>;
    // last read: '<token>'". The token is cut: it can run over any number of bytes and lines (the
    // fuzzer found one), and the line and column already say where.
    std::string w = ex.what();
    const size_t k = w.find(": ", w.find("parse error"));
    if (k != std::string::npos) w.erase(0, k + 2);
    if (const size_t last = w.find("; last read: "); last != std::string::npos) w.erase(last);
    if (w.size() > 200) w.resize(200);
    error_ = located(*source_, position > 0 ? position - 1 : 0, w);
    // Stopped at the end while a container was open: cut short. Not after a complete document
    // (`{...} x` also fails at the end, reading the stray literal).
    ended_early_ = position >= source_->size() && !open_.empty();
    return false;
  }

  const std::string* source_ = nullptr;
  bool ended_early_ = false;  // the error is that the input stopped, not a wrong byte
  bool too_deep_ = false;
  std::string error_;

 private:
  // The slot for the next value: the root, the next array item, or the member whose key came last.
  JsonValue* add() {
    if (open_.empty()) return root_;
    JsonValue* parent = open_.back();
    if (parent->type_ == JsonValue::Type::kArray) return &parent->array_.emplace_back();
    return &parent->object_.back().second;
  }
  JsonValue* number(JsonValue::Number kind) {
    JsonValue* v = add();
    v->type_ = JsonValue::Type::kNumber;
    v->number_ = kind;
    return v;
  }
  bool open(JsonValue::Type type) {
    if (open_.size() >= kMaxDepth) return too_deep_ = true, false;
    JsonValue* v = add();
    v->type_ = type;
    open_.push_back(v);
    return true;
  }

  JsonValue* root_;
  std::vector<JsonValue*> open_;
};

const JsonValue* JsonValue::get(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : object_)
    if (k == key) return &v;
  return nullptr;
}

bool JsonValue::to_u64(uint64_t* out) const {
  if (type_ != Type::kNumber || number_ == Number::kFloat) return false;
  if (number_ == Number::kSigned) {
    if (i64_ < 0) return false;
    *out = static_cast<uint64_t>(i64_);
  } else {
    *out = u64_;
  }
  return true;
}

bool JsonValue::to_i64(int64_t* out) const {
  if (type_ != Type::kNumber || number_ == Number::kFloat) return false;
  if (number_ == Number::kUnsigned) {
    if (u64_ > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u64_);
  } else {
    *out = i64_;
  }
  return true;
}

bool JsonValue::to_double(double* out) const {
  if (type_ != Type::kNumber) return false;
  *out = number_ == Number::kFloat    ? f64_
         : number_ == Number::kSigned ? static_cast<double>(i64_)
                                      : static_cast<double>(u64_);
  return true;
}

std::string valid_utf8(const std::string& s) {
  std::string repaired;
  return replace_invalid_utf8(s, &repaired) ? repaired : s;
}

bool parse_json(const std::string& raw, JsonValue* out, std::string* error, bool* ended_early) {
  // nlohmann's parser refuses bytes that are not UTF-8. A string holding some (a path or a name
  // edited by hand in another encoding) reads as U+FFFD instead, as our writers write such bytes
  // (util/json_string.h), rather than losing the whole document; outside strings U+FFFD is still
  // an error. Positions in error messages then count the replacement's 3 bytes.
  // nlohmann's lexer takes a NUL byte for the end of the input and would accept a document with
  // anything after one; JSON allows no raw NUL anywhere (and read_file's early check refuses one).
  if (const size_t nul = raw.find('\0'); nul != std::string::npos) {
    if (error) *error = located(raw, nul, "a NUL byte");
    return false;
  }
  std::string repaired;
  const std::string& bytes = replace_invalid_utf8(raw, &repaired) ? repaired : raw;
  JsonValue v;
  JsonBuilder b(&v);
  b.source_ = &bytes;
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(bytes, &b, nlohmann::json::input_format_t::json, /*strict=*/true,
                                   /*ignore_comments=*/false);
  } catch (const std::exception& e) {  // the SAX parser reports through parse_error; this is bad_alloc
    b.error_ = std::string("invalid JSON: ") + e.what();
  }
  if (!ok) {
    if (b.too_deep_) b.error_ = located(bytes, offset_of_too_deep(bytes), "nesting too deep");
    if (error) *error = b.error_.empty() ? "invalid JSON" : b.error_;
    if (ended_early) *ended_early = b.ended_early_ && !b.too_deep_;
    return false;
  }
  *out = std::move(v);
  return true;
}

}  // namespace gpushim::analysis
