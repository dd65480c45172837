// /usr/bin/env (printing the environment) for TSan builds: a native command for the launcher's
// tests that a TSan-built shim can be preloaded into (see true.cpp).
#include <cstdio>

extern char** environ;

int main() {
  for (char** e = environ; *e != nullptr; ++e) std::puts(*e);
  return 0;
}
