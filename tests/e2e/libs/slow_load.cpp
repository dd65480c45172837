// A plugin whose constructor takes 11 s (a library that warms a cache at load): its dlopen holds
// the dynamic loader's lock that long, and whatever waits for that lock (dladdr, another dlopen)
// waits with it; longer than the 10 s the exit once allowed a snapshot before dropping the report.
#include <unistd.h>

__attribute__((constructor)) static void warm_up_slowly() { sleep(11); }
