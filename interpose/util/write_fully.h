// write(2) until every byte is written: reports, traces, snapshots and metrics all need it.
#pragma once

#include <cstddef>

namespace gpushim {

// Retries after EINTR and short writes. Returns 0, or the errno of the failing write (also left
// in errno); a write that makes no progress counts as EIO rather than spinning. A write past the
// host's RLIMIT_FSIZE fails with EFBIG and never raises SIGXFSZ in the host (ScopedNoWriteSignals):
// whatever the shim writes, a file-size limit costs that write, never the process.
int write_fully(int fd, const void* data, size_t n);

}  // namespace gpushim
