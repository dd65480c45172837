// A dependency whose constructor changes the working directory, as some libraries do at load
// (sandboxing helpers, job frameworks): it runs before the preload's constructor, so a relative
// LD_PRELOAD no longer names the preloaded library from the directory the program starts in.
#include <unistd.h>

namespace {
__attribute__((constructor)) void leave_the_starting_directory() { (void)!chdir("/"); }
}  // namespace

extern "C" __attribute__((noinline)) const char* e2e_chdir_at_load_cwd() {
  static char cwd[4096];
  return getcwd(cwd, sizeof cwd);
}
