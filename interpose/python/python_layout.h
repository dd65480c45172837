// Where CPython 3.9-3.13 keep the few fields a stack walk reads: the thread's frame chain, each
// frame's code object and instruction position, and the code object's names and line table.
//
// Why struct reading and not the C API: PyTorch releases the GIL around every op, so most CUDA
// allocations happen in a thread that does not hold it, and the frame API needs the GIL (3.11+
// even allocates frame objects). Walking the *calling thread's own* chain is safe without the GIL:
// only that thread links and unlinks its frames, and it is inside our hook while we read.
//
// The offsets were measured with offsetof() against each version's installed headers
// (Py_BUILD_CORE, internal/pycore_frame.h), x86-64 and aarch64 (LP64) release builds:
// interpose/python/tools/print_layout.c prints them; rerun it for a new version. Within a minor
// version CPython keeps these layouts (debuggers and profilers such as py-spy rely on that).
// Debug (Py_TRACE_REFS) and free-threaded builds lay objects out differently and are refused by
// python_runtime.cpp.
#pragma once

#include <cstdint>

namespace gpushim {

enum class PyFrameModel : uint8_t {
  kFrameObject,       // 3.9, 3.10: a chain of PyFrameObject, one C-level eval call per frame
  kInterpreterFrame,  // 3.11+: _PyInterpreterFrame; one eval call runs several Python frames
};

// How a code object maps instruction offsets to lines (decoders in line_table.h).
enum class LineTableFormat : uint8_t {
  kLnotab39 = 0,       // co_lnotab: (byte delta, signed line delta) pairs
  kLinetable310 = 1,   // PEP 626 co_linetable: (byte delta, line delta or -128) pairs
  kLocations311 = 2,   // 3.11+ co_linetable: varint location entries in code units
};

struct PythonLayout {
  int minor;  // 3.<minor>
  PyFrameModel model;
  LineTableFormat lines;

  // PyThreadState: the innermost frame is *(tstate + tstate_frame), or, where cframe_current >= 0,
  // *(*(tstate + tstate_frame) + cframe_current) (3.11/3.12 go through _PyCFrame).
  int16_t tstate_frame;
  int16_t cframe_current;

  // Frame (PyFrameObject or _PyInterpreterFrame).
  int16_t frame_code;       // PyCodeObject* (3.13: f_executable, a code object except in C-stack frames)
  int16_t frame_previous;   // f_back / previous
  int16_t frame_position;   // 3.9/3.10: int f_lasti; 3.11+: _Py_CODEUNIT* prev_instr / instr_ptr
  int16_t frame_localsplus; // first fast local (the arguments come first)
  int16_t frame_is_entry;   // 3.11: bool, the outermost frame of one eval call; -1 elsewhere
  int16_t frame_owner;      // 3.11+: char owner; -1 before
  int8_t lasti_scale;       // 3.9: f_lasti is a byte offset (1); 3.10: an instruction index (2)
  int8_t owner_generator;   // FRAME_OWNED_BY_GENERATOR
  int8_t owner_cstack;      // FRAME_OWNED_BY_CSTACK (3.12+: the C entry frame of an eval call); -1 if none

  // PyCodeObject.
  int16_t code_argcount;
  int16_t code_firstlineno;
  int16_t code_filename;
  int16_t code_name;          // co_qualname where it exists (3.11+), else co_name
  int16_t code_linetable;     // bytes: co_lnotab (3.9) or co_linetable
  int16_t code_adaptive;      // 3.11+: co_code_adaptive, the instructions; -1 before
  int16_t code_firsttraceable;// 3.11+: int _co_firsttraceable (frames before it are incomplete)
  int16_t code_version;       // 3.12+: uint32_t co_version, from a counter bumped per code object created; -1 before

  // str: PyASCIIObject / PyCompactUnicodeObject sizes (the compact character data follows them).
  int16_t ascii_size;
  int16_t compact_size;
};

// Offsets common to every supported version (PyObject head, PyVarObject, PyBytesObject, str).
constexpr int kPyObjectType = 8;      // ob_type
constexpr int kPyVarSize = 16;        // ob_size
constexpr int kPyBytesData = 32;      // ob_sval
constexpr int kPyUnicodeLength = 16;  // length, in code points
constexpr int kPyUnicodeState = 32;   // state bit field: kind bits 2-4, compact bit 5, ascii bit 6

// The layout of CPython 3.<minor>, or null when that version is not supported.
inline const PythonLayout* python_layout_for(int major, int minor) {
  static constexpr PythonLayout kLayouts[] = {
      {.minor = 9, .model = PyFrameModel::kFrameObject, .lines = LineTableFormat::kLnotab39,
       .tstate_frame = 24, .cframe_current = -1, .frame_code = 32, .frame_previous = 24, .frame_position = 104,
       .frame_localsplus = 360, .frame_is_entry = -1, .frame_owner = -1, .lasti_scale = 1,
       .owner_generator = -1, .owner_cstack = -1, .code_argcount = 16, .code_firstlineno = 40,
       .code_filename = 104, .code_name = 112, .code_linetable = 120, .code_adaptive = -1,
       .code_firsttraceable = -1, .code_version = -1, .ascii_size = 48, .compact_size = 72},
      {.minor = 10, .model = PyFrameModel::kFrameObject, .lines = LineTableFormat::kLinetable310,
       .tstate_frame = 24, .cframe_current = -1, .frame_code = 32, .frame_previous = 24, .frame_position = 96,
       .frame_localsplus = 352, .frame_is_entry = -1, .frame_owner = -1, .lasti_scale = 2,
       .owner_generator = -1, .owner_cstack = -1, .code_argcount = 16, .code_firstlineno = 40,
       .code_filename = 104, .code_name = 112, .code_linetable = 120, .code_adaptive = -1,
       .code_firsttraceable = -1, .code_version = -1, .ascii_size = 48, .compact_size = 72},
      {.minor = 11, .model = PyFrameModel::kInterpreterFrame, .lines = LineTableFormat::kLocations311,
       .tstate_frame = 56, .cframe_current = 8, .frame_code = 32, .frame_previous = 48, .frame_position = 56,
       .frame_localsplus = 72, .frame_is_entry = 68, .frame_owner = 69, .lasti_scale = 0, .owner_generator = 1,
       .owner_cstack = -1, .code_argcount = 56, .code_firstlineno = 72, .code_filename = 112, .code_name = 128,
       .code_linetable = 136, .code_adaptive = 184, .code_firsttraceable = 168, .code_version = -1,
       .ascii_size = 48, .compact_size = 72},
      {.minor = 12, .model = PyFrameModel::kInterpreterFrame, .lines = LineTableFormat::kLocations311,
       .tstate_frame = 56, .cframe_current = 0, .frame_code = 0, .frame_previous = 8, .frame_position = 56,
       .frame_localsplus = 72, .frame_is_entry = -1, .frame_owner = 70, .lasti_scale = 0, .owner_generator = 1,
       .owner_cstack = 3, .code_argcount = 52, .code_firstlineno = 68, .code_filename = 112, .code_name = 128,
       .code_linetable = 136, .code_adaptive = 192, .code_firsttraceable = 176, .code_version = 92,
       .ascii_size = 40, .compact_size = 56},
      {.minor = 13, .model = PyFrameModel::kInterpreterFrame, .lines = LineTableFormat::kLocations311,
       .tstate_frame = 72, .cframe_current = -1, .frame_code = 0, .frame_previous = 8, .frame_position = 56,
       .frame_localsplus = 72, .frame_is_entry = -1, .frame_owner = 70, .lasti_scale = 0, .owner_generator = 1,
       .owner_cstack = 3, .code_argcount = 52, .code_firstlineno = 68, .code_filename = 112, .code_name = 128,
       .code_linetable = 136, .code_adaptive = 200, .code_firsttraceable = 184, .code_version = 92,
       .ascii_size = 40, .compact_size = 56},
  };

  if (major != 3) return nullptr;
  for (const PythonLayout& l : kLayouts)
    if (l.minor == minor) return &l;
  return nullptr;
}

}  // namespace gpushim
