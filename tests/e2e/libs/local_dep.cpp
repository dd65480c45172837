// A symbol that only the local scope of libe2e_local_user (loaded with RTLD_LOCAL) contains.
extern "C" __attribute__((noinline)) int e2e_local_only() { return 42; }
