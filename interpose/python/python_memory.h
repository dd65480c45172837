// Reads of interpreter memory. Every read goes through here so that the frame walker states its
// assumptions once: the address is 8-byte aligned where a pointer is read, and it belongs to an
// object the calling thread keeps alive (its own frames, their code objects, and what those own).
#pragma once

#include <cstdint>
#include <cstring>

namespace gpushim {

template <typename T>
inline T py_load(uintptr_t addr) {
  T v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof(T));
  return v;
}

inline bool py_pointer_plausible(uintptr_t p) {
  // Objects and frames are at least 8-byte aligned, and nothing lives in the first page.
  return p >= 4096 && (p & 7) == 0;
}

}  // namespace gpushim
