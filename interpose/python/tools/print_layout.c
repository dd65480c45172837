/* Prints the offsets in python_layout.h for the CPython whose headers it is compiled against.
 * Not part of the build: run it by hand when adding a Python version, e.g.
 *   V=3.13; P=$(python$V -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
 *   cc -w -I$P -I$P/internal interpose/python/tools/print_layout.c -o /tmp/layout && /tmp/layout
 * and compare with (or add) the row of that version. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030b0000
#include "internal/pycore_frame.h"
#endif

#define P(name, expr) printf("  %-20s %d\n", name, (int)(expr))

int main(void) {
  printf("CPython %s\n", PY_VERSION);
#if PY_VERSION_HEX < 0x030b0000
  P("tstate_frame", offsetof(PyThreadState, frame));
  P("frame_code", offsetof(PyFrameObject, f_code));
  P("frame_previous", offsetof(PyFrameObject, f_back));
  P("frame_position", offsetof(PyFrameObject, f_lasti));
  P("frame_localsplus", offsetof(PyFrameObject, f_localsplus));
  P("code_name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX < 0x030a0000
  P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#else
  P("code_linetable", offsetof(PyCodeObject, co_linetable));
#endif
#else
#if PY_VERSION_HEX < 0x030d0000
  P("tstate_frame", offsetof(PyThreadState, cframe));
  P("cframe_current", offsetof(_PyCFrame, current_frame));
  P("frame_code", offsetof(_PyInterpreterFrame, f_code));
  P("frame_position", offsetof(_PyInterpreterFrame, prev_instr));
#else
  P("tstate_frame", offsetof(PyThreadState, current_frame));
  P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
  P("frame_position", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
  P("frame_previous", offsetof(_PyInterpreterFrame, previous));
  P("frame_localsplus", offsetof(_PyInterpreterFrame, localsplus));
#if PY_VERSION_HEX < 0x030c0000
  P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#else
  P("owner_cstack", FRAME_OWNED_BY_CSTACK);
#endif
  P("frame_owner", offsetof(_PyInterpreterFrame, owner));
  P("owner_generator", FRAME_OWNED_BY_GENERATOR);
  P("code_name", offsetof(PyCodeObject, co_qualname));
  P("code_linetable", offsetof(PyCodeObject, co_linetable));
  P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
  P("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
#if PY_VERSION_HEX >= 0x030c0000
  P("code_version", offsetof(PyCodeObject, co_version));
#endif
#endif
  P("code_argcount", offsetof(PyCodeObject, co_argcount));
  P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
  P("code_filename", offsetof(PyCodeObject, co_filename));
  P("ascii_size", sizeof(PyASCIIObject));
  P("compact_size", sizeof(PyCompactUnicodeObject));
  /* Constants python_layout.h assumes for every version. */
  P("kPyObjectType", offsetof(PyObject, ob_type));
  P("kPyVarSize", offsetof(PyVarObject, ob_size));
  P("kPyBytesData", offsetof(PyBytesObject, ob_sval));
  P("kPyUnicodeLength", offsetof(PyASCIIObject, length));
  P("kPyUnicodeState", offsetof(PyASCIIObject, state));
  return 0;
}
