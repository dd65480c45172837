// The system and CUDA headers most test programs include, compiled once per build tree and
// reused by every program (tests/e2e/CMakeLists.txt): parsing them was ~40% of the programs'
// compile time (51 programs: 63 CPU-s with g++, 66 with clang under ASan, against 38 and 38).
// Only system headers: a program's own helpers stay in the files it includes itself, and every
// program still includes what it uses, as the demo (built without this header) must.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
