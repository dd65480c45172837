// Replacing a file that others read while we rewrite it (the metrics file).
#pragma once

#include <sys/stat.h>

#include <string>

namespace gpushim {

// Replaces `path` with `data` so that a reader opening it sees the previous complete file or the
// new complete file, never a partial one: the data goes to a hidden temporary file in the same
// directory (rename is atomic only within one filesystem), which is then renamed over `path`.
// The temporary name (replacement_temp_path) does not end in .prom, so node_exporter's textfile
// collector never reads it. Mode 0644 (less the umask): the collector usually runs as another
// user. Returns 0, or the errno of the step that failed (the temporary file is then removed: only
// ever the one this call created). `written`, when given, receives the new file's device and inode
// (to know it again later).
int replace_file_atomically(const std::string& path, const std::string& data, struct stat* written = nullptr);

// A fresh hidden temporary name beside `path`, at every call: ".<name>.tmp.<pid>.<16 hex digits
// from getrandom>". The pid alone is not unique where containers share a directory; a name that
// is taken anyway is someone else's, and left alone.
std::string replacement_temp_path(const std::string& path);

}  // namespace gpushim
