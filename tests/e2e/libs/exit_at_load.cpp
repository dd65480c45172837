// A plugin whose constructor gives up and calls exit(3), as a library that finds its environment
// unusable may: exit() then runs while the dynamic loader's lock is held (inside dlopen), which
// whatever waits for that lock (dladdr, dlopen in another thread) never gets again.
#include <cstdio>
#include <cstdlib>

__attribute__((constructor)) static void give_up_at_load() {
  std::fprintf(stderr, "exit_at_load: cannot initialize, exit(3)\n");
  std::exit(3);
}
