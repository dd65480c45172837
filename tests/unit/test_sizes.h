// Byte sizes the tests write their cases in. One definition here rather than one per file: the
// test binary is a unity build (CMakeLists.txt), where every file's anonymous namespace is shared
// with the others of its batch.
#pragma once

#include <cstdint>

namespace gpushim {
inline constexpr uint64_t KiB = 1ull << 10;
inline constexpr uint64_t MiB = 1ull << 20;
inline constexpr uint64_t GiB = 1ull << 30;
inline constexpr uint64_t kKiB = KiB;
inline constexpr uint64_t kMiB = MiB;
}  // namespace gpushim
