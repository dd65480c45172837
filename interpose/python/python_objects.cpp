#include "python/python_objects.h"

#include "python/python_memory.h"

namespace gpushim {
namespace {

void append_utf8(uint32_t cp, std::string* out) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogates (surrogateescape'd file names)
  if (cp > 0x10FFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool has_type(uintptr_t obj, uintptr_t type) {
  return py_pointer_plausible(obj) && py_load<uintptr_t>(obj + kPyObjectType) == type;
}

}  // namespace

bool copy_python_str(const PythonRuntime& rt, uintptr_t obj, size_t max_chars, std::string* out) {
  *out = "?";
  if (!has_type(obj, rt.str_type)) return false;
  const uint32_t state = py_load<uint32_t>(obj + kPyUnicodeState);
  const unsigned kind = (state >> 2) & 7;
  const bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  const int64_t length = py_load<int64_t>(obj + kPyUnicodeLength);
  if (!compact || length < 0 || (kind != 1 && kind != 2 && kind != 4)) return false;
  const size_t n = static_cast<size_t>(length) < max_chars ? static_cast<size_t>(length) : max_chars;
  const uintptr_t data = obj + (ascii ? rt.layout->ascii_size : rt.layout->compact_size);
  out->clear();
  if (ascii) {
    out->assign(reinterpret_cast<const char*>(data), n);
    return true;
  }
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t cp = kind == 1   ? py_load<uint8_t>(data + i)
                  : kind == 2 ? py_load<uint16_t>(data + 2 * i)
                              : py_load<uint32_t>(data + 4 * i);
    append_utf8(cp, out);
  }
  return true;
}

bool copy_python_bytes(const PythonRuntime& rt, uintptr_t obj, size_t max_bytes, std::string* out) {
  out->clear();
  if (!has_type(obj, rt.bytes_type)) return false;
  const int64_t size = py_load<int64_t>(obj + kPyVarSize);
  if (size < 0 || static_cast<uint64_t>(size) > max_bytes) return false;
  out->assign(reinterpret_cast<const char*>(obj + kPyBytesData), static_cast<size_t>(size));
  return true;
}

}  // namespace gpushim
