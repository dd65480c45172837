// Whether the calling thread runs inside the dynamic loader: a library's constructor or destructor
// that dlopen or dlclose called (or _dl_fini at exit), found by a return address on the stack in
// ld.so (its span as util/loaded_modules.h gives every module's). Such a thread holds the loader's
// lock, which dladdr (and any dlopen) of another thread waits for until the loader returns: exit()
// from there must not wait for such a thread.
#pragma once

namespace gpushim {

bool called_from_dynamic_loader();

}  // namespace gpushim
