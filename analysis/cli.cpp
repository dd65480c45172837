#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "util/units.h"

namespace gpushim::analysis {

const std::vector<std::string>& Cli::all(const std::string& name) const {
  static const std::vector<std::string> kNone;
  auto it = options.find(name);
  return it == options.end() ? kNone : it->second;
}

bool parse_cli(const std::vector<std::string>& args, const std::set<std::string>& with_value,
               const std::set<std::string>& flags, Cli* out, std::string* error) {
  Cli cli;
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (only_positional || a.empty() || a[0] != '-' || a == "-") {
      cli.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      continue;
    }
    if (a == "-o") a = "--output";
    if (a == "-h") a = "--help";
    std::string value;
    bool inline_value = false;
    if (const size_t eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      inline_value = true;
    }
    if (flags.count(a) && !inline_value) {
      cli.options[a];
      continue;
    }
    if (!with_value.count(a)) {
      *error = "unknown option " + a;
      return false;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        *error = a + " needs a value";
        return false;
      }
      value = args[++i];
    }
    cli.options[a].push_back(value);
  }
  *out = std::move(cli);
  return true;
}

bool write_output(const std::string& path, const std::string& data, std::string* error) {
  if (path == "-") {
    if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size() || std::fflush(stdout) != 0) {
      *error = "cannot write to stdout";
      return false;
    }
    return true;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *error = "cannot write " + path + ": " + std::strerror(errno);
      ::close(fd);
      return false;
    }
    done += static_cast<size_t>(w);
  }
  if (::close(fd) != 0) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool parse_size(const std::string& text, uint64_t* out) { return parse_bytes(text, out); }

int usage_error(const char* cmd, const std::string& message) {
  std::fprintf(stderr, "gpushim-analyze %s: %s\n(see gpushim-analyze %s --help)\n", cmd, message.c_str(), cmd);
  return 2;
}

}  // namespace gpushim::analysis
