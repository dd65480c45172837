// Whose code a stack frame is, so that every printed stack (the stderr summary, OOM advice,
// gpushim-analyze summary/diff/merge) leads with the line of the user's own code: under ctypes,
// numba or PyTorch dozens of library frames sit between it and CUDA, and six innermost frames are
// all alike. The JSON keeps every frame; this only decides what is shown first.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "stacks/symbolizer.h"

namespace gpushim {

enum class FrameRole {
  kPlumbing,  // the shim, the CUDA runtime and driver, a static runtime linked into the program
              // (libcudart_static_*, __cudart*, its entry points such as cudaMalloc): never shown
  kLibrary,   // the interpreter, libffi/ctypes, the C/C++ runtime, the Python standard library,
              // site-packages/dist-packages, known frameworks (torch, numba, cupy, triton, nccl, ...),
              // by module, and by namespace where linked statically (c10::, at::, torch::, cublas...)
  kUser,      // everything else: the program's own code
};

FrameRole frame_role(const FrameInfo& f);

// A module of the C and C++ runtimes under every program (libc, ld.so, libstdc++, libgcc_s, libm,
// libpthread, libdl, librt), by path or file name. Its frames (_start's callers, thread start,
// std::thread's trampoline) get names but never lines: where its separate debug file is installed
// (Debian's libc6-dbg, which valgrind pulls in), reading a line in it inflated ~15 MB of
// compressed DWARF, ~80 ms of every reporting process's exit, for lines in glibc's own sources.
bool c_runtime_module(std::string_view module);

struct ShownFrames {
  std::vector<size_t> indices;  // into the stack: the innermost user frame first, then the user
                                // frames that called it, outermost last
  size_t library_inside = 0;    // library frames between that user frame and CUDA, not shown
};

// At most `max` frames to show: the innermost user frame and the user frames that called it. A
// stack without a user frame shows its innermost frames but plumbing.
ShownFrames frames_to_show(const std::vector<FrameInfo>& frames, size_t max);

// Stacks listed together whose shown frames are alike (one user line reached through different
// library code: PyTorch's operators under one Python line) read as the same site twice. For each,
// the indices of the frames not shown that tell it from the others, in the order they are met:
// inward from the user frame through the folded library frames (or, without a user frame, outward
// past the last shown frame), a frame wherever the alike stacks part. Empty where none is needed.
std::vector<std::vector<size_t>> telling_frames(const std::vector<const std::vector<FrameInfo>*>& stacks, size_t max);

// A frame of PyTorch's CUDA allocator (libc10_cuda.so, or c10's CUDACachingAllocator linked in):
// under its caching allocator, a stack with such a frame allocated a segment of the cache.
bool torch_allocator_frame(const FrameInfo& f);

// The innermost user frame (or, without one, the innermost frame that is not plumbing); null if none.
const FrameInfo* user_frame(const std::vector<FrameInfo>& frames);

}  // namespace gpushim
