// RTLD_NEXT chain, last link (see next_a.cpp).
extern "C" __attribute__((noinline)) const char* e2e_next_probe() { return "B"; }

// Referenced by libe2e_next_a so the linker keeps this library (--as-needed would drop it).
extern "C" int e2e_next_b_present() { return 1; }
