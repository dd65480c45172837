// Runs a callable `frames` calls deep, so that a stack captured inside it really has that many
// frames: a benchmark of capture at depth 64 must not stop at the 15 frames main() gives it.
#pragma once

namespace gpushim_bench {

template <typename F>
__attribute__((noinline)) void at_depth(int frames, F& f) {
  if (frames <= 0) {
    f();
  } else {
    at_depth(frames - 1, f);
  }
  // Keeps this a real frame: without it the recursion becomes a tail call (a jump), one frame.
  asm volatile("" ::: "memory");
}

}  // namespace gpushim_bench
