// The JSON reader for gpushim's own documents (reports): nlohmann-json's parser (strict RFC 8259,
// UTF-8 validated, fuzzed upstream) driven through its SAX interface into this small tree, so
// 64-bit integers stay exact, nesting depth is bounded, members keep their order, and bad input is
// an error message, never an exception or a crash (the readers are fuzzed here too).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/json_string.h"  // the writers' half: append_json_string

namespace gpushim::analysis {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_bool() const { return type_ == Type::kBool; }

  // Object member by key (the first if repeated), or null when absent or not an object.
  const JsonValue* get(std::string_view key) const;
  const std::vector<JsonValue>& items() const { return array_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return object_; }
  const std::string& str() const { return text_; }  // string value (unescaped)
  bool boolean() const { return bool_; }

  // Numbers, exactly: false unless the number is an integer that fits.
  bool to_u64(uint64_t* out) const;
  bool to_i64(int64_t* out) const;
  bool to_double(double* out) const;  // any number

  JsonValue() = default;  // null

 private:
  friend class JsonBuilder;
  enum class Number : uint8_t { kUnsigned, kSigned, kFloat };  // as the parser classified it
  Type type_ = Type::kNull;
  bool bool_ = false;
  Number number_ = Number::kUnsigned;
  union {  // by number_: one word per value, as a report holds millions of them
    uint64_t u64_ = 0;
    int64_t i64_;
    double f64_;
  };
  std::string text_;  // string value
  std::vector<JsonValue> array_;
  std::vector<std::pair<std::string, JsonValue>> object_;
};

// `s` with every byte that does not begin well-formed UTF-8 replaced by U+FFFD, as our JSON
// writers write it: for formats whose strings must be UTF-8 (protobuf's `string` fields).
std::string valid_utf8(const std::string& s);

// Parses one JSON document (RFC 8259; surrounding whitespace allowed, nothing after it). Bytes in
// strings that are not UTF-8 read as U+FFFD. On failure returns false with a one-line message
// naming line and column; never throws or crashes. `ended_early`: the input stopped inside the
// document (cut short), rather than holding a wrong byte.
bool parse_json(const std::string& bytes, JsonValue* out, std::string* error, bool* ended_early = nullptr);

}  // namespace gpushim::analysis
