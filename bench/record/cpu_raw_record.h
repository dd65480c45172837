// The record the CPU allocation recorder (cpu_alloc_recorder.cpp) writes and the converter
// (cpu_trace_convert.cpp) reads: fixed size, host byte order, no header. Only these two use it.
#pragma once

#include <cstdint>

namespace gpushim_bench {

inline constexpr uint32_t kRawAlloc = 1;  // ptr, size: a tensor storage from c10::alloc_cpu
inline constexpr uint32_t kRawFree = 2;   // ptr: that storage freed
inline constexpr uint32_t kRawMark = 3;   // a step of the model begins

struct RawRecord {
  uint64_t t_ns;  // CLOCK_MONOTONIC
  uint64_t ptr;
  uint64_t size;
  uint32_t kind;
  uint32_t reserved;
};
static_assert(sizeof(RawRecord) == 32, "the file layout");

}  // namespace gpushim_bench
