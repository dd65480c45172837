#include "big_inline.h"

void other_use() {
  if (g_sink == 12345) big_inline();  // a second copy of big_inline, which the linker drops
}
