#include "accounting/memory_kind.h"

namespace gpushim {

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::kDevice: return "device";
    case MemoryKind::kManaged: return "managed";
    case MemoryKind::kHost: return "host";
    case MemoryKind::kGraph: return "graph";
    case MemoryKind::kImported: return "imported";
  }
  return "unknown";
}

}  // namespace gpushim
