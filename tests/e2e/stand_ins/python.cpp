// python3 for TSan builds. A TSan-built shim can only be preloaded into a program that carries the
// TSan runtime itself, and no Python interpreter does; this one does, and runs a real interpreter
// from its shared library: STAND_IN_LIBPYTHON names the library, PYTHONHOME its prefix (the
// tests set both, tests/e2e/pythons.py). Named python3 so that the launcher sees a Python command.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const char* lib = std::getenv("STAND_IN_LIBPYTHON");
  if (lib == nullptr) {
    std::fprintf(stderr, "python3 stand-in: STAND_IN_LIBPYTHON is not set\n");
    return 127;
  }
  // Global: extension modules (ctypes) take the interpreter's symbols from the global scope, and so
  // does the shim when it looks for the interpreter.
  void* handle = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
  using MainFn = int (*)(int, char**);
  auto py_main = handle ? reinterpret_cast<MainFn>(dlsym(handle, "Py_BytesMain")) : nullptr;
  if (py_main == nullptr) {
    std::fprintf(stderr, "python3 stand-in: cannot run %s: %s\n", lib, dlerror());
    return 127;
  }
  return py_main(argc, argv);
}
