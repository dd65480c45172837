#include "util/thread_block.h"

namespace gpushim::thread_block_internal {

char* own_block() {
  // Dynamic TLS (the default model of a shared object): no claim on the static TLS surplus.
  alignas(16) static thread_local char block[kThreadBlockBytes];
  return block;
}

}  // namespace gpushim::thread_block_internal
