// A program that never touches CUDA. Tests preload the shim into /bin/true for that; TSan builds
// cannot (the shim needs the TSan runtime of an instrumented executable), so they use this.
int main() { return 0; }
