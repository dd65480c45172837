// The gpushim release. kVersionTag is kept whole in libgpushim.so, where the launcher reads it
// (`gpushim --version` names the version of the library it preloads, whichever build that is).
#pragma once

namespace gpushim {

// `used`: without it the compiler folds kVersion into a bare "0.9.0" and the whole tag survives only
// in the DWARF, so a stripped library (a bundle, a distribution package) had no version to read.
// `retain`: nothing references the tag, so the linker's --gc-sections (libgpushim.so is linked
// with it) dropped its section all the same.
[[gnu::used, gnu::retain]] inline constexpr char kVersionTag[] = "gpushim version " GPUSHIM_VERSION;
inline constexpr const char* kVersion = kVersionTag + sizeof("gpushim version ") - 1;

}  // namespace gpushim
