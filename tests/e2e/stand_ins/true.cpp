// /bin/true for TSan builds: a program that never touches CUDA (and links nothing of it). Tests
// preload the shim into /bin/true for that; a TSan-built shim can only be preloaded into a program
// that carries the TSan runtime itself, so TSan builds use this instead.
int main() { return 0; }
