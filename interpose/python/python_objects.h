// Copies of immutable interpreter objects (str, bytes) into our own memory, made once per code
// object so that reports never depend on the interpreter still being alive.
#pragma once

#include <cstdint>
#include <string>

#include "python/python_runtime.h"

namespace gpushim {

// UTF-8 copy of a str (compact strings only, which is what code objects hold), at most
// `max_chars` characters. False (and `out` left as "?") when `obj` is not such a str.
bool copy_python_str(const PythonRuntime& rt, uintptr_t obj, size_t max_chars, std::string* out);

// Copy of a bytes object's contents, at most `max_bytes`. False when `obj` is not bytes.
bool copy_python_bytes(const PythonRuntime& rt, uintptr_t obj, size_t max_bytes, std::string* out);

}  // namespace gpushim
