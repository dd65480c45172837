// Prints, one per line, every GPUSHIM_POLICY value the shim's configuration accepts, so that the
// benchmark driver measures each policy there is (a new one appears without touching scripts).
// With --variables it prints every GPUSHIM_* variable name instead.
#include <cstdio>
#include <cstring>

#include "config/config.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--variables") == 0) {
    for (const auto& v : gpushim::config_variable_docs()) std::printf("%s\n", v.name.c_str());
    return 0;
  }
  // PolicyKind is a small dense enum; a value is offered when it has a name and the configuration
  // parser accepts that name.
  for (int i = 0; i < 64; ++i) {
    const char* name = gpushim::policy_name(static_cast<gpushim::PolicyKind>(i));
    if (std::strcmp(name, "unknown") == 0) continue;
    if (gpushim::parse_config({{"GPUSHIM_POLICY", name}}).ok()) std::printf("%s\n", name);
  }
  return 0;
}
