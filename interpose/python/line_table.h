// Instruction offset -> source line, for the line tables of CPython 3.9-3.13.
//
// The shim copies a code object's line table once, when it first sees the code object in an
// allocation stack, and decodes it only when a report is written: the hot path never computes a
// line, and the interpreter may be long gone (or finalized) by report time. The decoders follow
// CPython's own PyCode_Addr2Line for each format, so lines match what a traceback would print.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "python/python_layout.h"

namespace gpushim {

// The line of the instruction at `byte_offset` (bytes from the start of the code; negative before
// the first instruction, which maps to `first_line` as in CPython), or 0 when the table says the
// instruction has no line (or the table is malformed).
int python_line_for_offset(LineTableFormat format, std::string_view table, int first_line, int byte_offset);

}  // namespace gpushim
