// Stack frames the tests write by hand. One definition here rather than one per file: the test
// binary is a unity build (CMakeLists.txt), where every file's anonymous namespace is shared with
// the others of its batch.
#pragma once

#include "stacks/symbolizer.h"

namespace gpushim {

// A symbolized native frame of `module` (its address: any resolved one).
inline FrameInfo native_frame(const char* function, const char* module, const char* file = "", int line = 0) {
  FrameInfo f;
  f.function = function;
  f.module = module;
  f.file = file;
  f.line = line;
  f.address = 0x1000;
  return f;
}

inline FrameInfo python_frame(const char* function, const char* file, int line) {
  FrameInfo f;
  f.function = function;
  f.file = file;
  f.line = line;
  f.python = true;
  return f;
}

}  // namespace gpushim
