// Loaded by loader_frames_test.cpp with dlopen: its constructor runs inside the dynamic loader and
// reports what called_from_dynamic_loader() says there, through a function of the test binary.
#include <dlfcn.h>

__attribute__((constructor)) static void probe_from_inside_the_loader() {
  using Report = void (*)();
  if (auto report = reinterpret_cast<Report>(dlsym(RTLD_DEFAULT, "gpushim_test_loader_probe_report"))) report();
}
