// The gpushim release. kVersionTag is kept whole in libgpushim.so, where the launcher reads it
// (`gpushim --version` names the version of the library it preloads, whichever build that is).
#pragma once

namespace gpushim {

inline constexpr char kVersionTag[] = "gpushim version " GPUSHIM_VERSION;
inline constexpr const char* kVersion = kVersionTag + sizeof("gpushim version ") - 1;

}  // namespace gpushim
