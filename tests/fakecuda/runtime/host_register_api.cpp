// cudaHostRegister / cudaHostUnregister: page-locking memory the caller allocated.
#include "runtime.h"

using namespace fakecudart;

// cudaHostRegister* flags have the CU_MEMHOSTREGISTER_* values.
cudaError_t CUDARTAPI cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  return Call([&] { return Driver().cuMemHostRegister_v2(ptr, size, flags); });
}

cudaError_t CUDARTAPI cudaHostUnregister(void* ptr) {
  return Call([&] { return Driver().cuMemHostUnregister(ptr); });
}
