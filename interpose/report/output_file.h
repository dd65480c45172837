// Where report/trace/metrics files go, and how they are created safely.
#pragma once

#include <string>

namespace gpushim {

// Expands a path template: %p -> pid, %h -> host name, %r -> the RANK variable (or "norank" when
// unset), %% -> %; the values of %h and %r are made one file-name component (every character but
// letters, digits and ".-_+" becomes '_', and "." or ".." becomes underscores); any other %x is kept as written. An empty template yields the default
// "gpushim.<exe name>.<pid>.json"; a template ending in '/' yields that default name inside it.
std::string expand_path_template(const std::string& tmpl, const std::string& exe_name, int pid,
                                 const char* default_suffix = ".json");

// The working directory now, or "" when it cannot be had (deleted, too long).
std::string working_directory();
// `path` as seen from `dir`: a relative path (the default name included) is taken from `dir`, so
// that a program changing its working directory later does not move the file; an absolute path,
// or no `dir`, is left as it is.
std::string anchored_at(const std::string& path, const std::string& dir);

// Whether a file may land in $TMPDIR when its directory refuses it. Only a default name (the user
// named no path, and the working directory is not writable) may: a path the user named is where
// they will look, so one that cannot be created is one line and no file anywhere else.
enum class WhereAllowed { kNamedPathOnly, kOrTmpdir };
// The rule above for a GPUSHIM_* path template ("" is the default name).
inline WhereAllowed where_allowed(const std::string& tmpl) {
  return tmpl.empty() ? WhereAllowed::kOrTmpdir : WhereAllowed::kNamedPathOnly;
}

// Creates `path` with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 and writes `data` fully. An existing
// file is never overwritten: ".1", ".2", ... is inserted before the extension instead. If the
// directory is not writable and `where` allows, falls back to $TMPDIR (else /tmp) with a one-line
// notice. Returns the path actually written, or "" on failure (after a one-line message).
// A path naming an existing character device (/dev/null, a terminal; not a symlink to one) is
// written to as it is.
// /dev/stdout and /dev/stderr (also as /dev/fd/N, /proc/self/fd/N) go to the process's own
// descriptor 1 or 2, whatever it is (a terminal, a pipe, a file the shell opened).
std::string write_new_file(const std::string& path, const std::string& data,
                           WhereAllowed where = WhereAllowed::kOrTmpdir);

// 1 or 2 when `path` names the process's standard output or error, else -1.
int standard_stream_of(const std::string& path);

// Why `path` could not be created (errno `err`), for the one line that says so: when its directory
// does not exist, that directory and how to make it, else strerror(err). gpushim creates no
// directories: a mistyped path or a template's field would grow trees nobody asked for, in the
// middle of someone else's process.
std::string cannot_create_reason(const std::string& path, int err);

}  // namespace gpushim

namespace gpushim {

// Like write_new_file, for a file written over time (the trace): creates `path` (or a suffixed
// name, or, as `where` allows, the same name under $TMPDIR) and returns the open descriptor
// (O_WRONLY|O_CLOEXEC), or -1 after a one-line message. *written receives the name actually created.
int create_new_file(const std::string& path, std::string* written, WhereAllowed where = WhereAllowed::kOrTmpdir);

}  // namespace gpushim
