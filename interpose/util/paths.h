// File-name arithmetic shared by everything that names output files or prints file names.
#pragma once

#include <string>
#include <string_view>

namespace gpushim {

// "dir/sub/name.json" -> "name.json"; a name without a slash is its own base name.
inline std::string_view base_name(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// base_name as a string of its own, for text built around it.
inline std::string file_name_of(std::string_view path) { return std::string(base_name(path)); }

// "dir/sub/name.json" -> "dir/sub"; "name" -> "."; "/name" -> "/".
inline std::string dir_name(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

// Inserts `tag` before the file name's extension: ("dir/r.json", ".1") -> "dir/r.1.json". The
// extension is the last dot of the file name unless that dot starts it (".hidden" has none);
// without one the tag goes at the end.
inline std::string insert_before_extension(std::string_view path, std::string_view tag) {
  const size_t slash = path.find_last_of('/');
  const size_t name_start = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = path.find_last_of('.');
  std::string out(path);
  if (dot == std::string_view::npos || dot <= name_start) return out.append(tag);
  return out.insert(dot, tag);
}

}  // namespace gpushim
