// Not a test: the program whose build compiles support/precompiled.h, which every e2e program
// then reuses (tests/e2e/CMakeLists.txt). An executable, so that its flags (-fPIE) are theirs.
int main() { return 0; }
