#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "util/units.h"
#include "util/write_fully.h"

namespace gpushim::analysis {
namespace {

constexpr size_t kWidth = 100;  // help lines wrap here
constexpr char kHelpName[] = "--help";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool iequal(const std::string& a, const char* b) {
  if (a.size() != std::strlen(b)) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// "a, b or c"
std::string one_of(const std::vector<Choice>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) s += i + 1 == choices.size() ? " or " : ", ";
    s += choices[i].name;
  }
  return s;
}

std::string joined_choices(const OptionSpec& o) {
  std::string s;
  for (const Choice& c : o.choices) s += (s.empty() ? "" : "|") + std::string(c.name);
  return s;
}

std::string plain_number(double v) {
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof(buf), "%.0f", v);
  else std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string range_text(const OptionSpec& o) {
  return " from " + plain_number(o.min) + " to " + plain_number(o.max);
}

// Checks `value` against what `o` takes; a choice comes back spelt as in the table.
bool check_value(const OptionSpec& o, std::string* value, std::string* error) {
  const std::string given = "not '" + *value + "'";
  switch (o.kind) {
    case ValueKind::kFlag:
    case ValueKind::kText: return true;
    case ValueKind::kChoice:
      for (const Choice& c : o.choices)
        if (iequal(*value, c.name)) return *value = c.name, true;
      *error = std::string(o.name) + " takes " + one_of(o.choices) + ", " + given;
      return false;
    case ValueKind::kCount: {
      const bool digits = !value->empty() && value->size() <= 19 &&
                          std::all_of(value->begin(), value->end(), [](char c) { return c >= '0' && c <= '9'; });
      const double v = digits ? std::strtod(value->c_str(), nullptr) : -1;
      if (digits && v >= o.min && v <= o.max) return true;
      *error = std::string(o.name) + " takes a whole number" + range_text(o) + ", " + given;
      return false;
    }
    case ValueKind::kNumber: {
      char* end = nullptr;
      const double v = value->empty() ? NAN : std::strtod(value->c_str(), &end);
      if (!value->empty() && *end == '\0' && v >= o.min && v <= o.max) return true;  // NaN fails both
      *error = std::string(o.name) + " takes a number" + range_text(o) + ", " + given;
      return false;
    }
    case ValueKind::kBytes: {
      // Sizes above 0: a 0 would read as "not given" and leave the default in place unsaid.
      uint64_t bytes = 0;
      if (parse_bytes(*value, &bytes) && bytes > 0) return true;
      *error = std::string(o.name) + " takes bytes above 0 with units (8GiB, 512MiB, 80GB, plain bytes), " + given;
      return false;
    }
  }
  return false;
}

const OptionSpec* find_option(const CommandSpec& spec, const std::string& name) {
  for (const OptionSpec& o : spec.options)
    if (name == o.name || (o.short_name && name == o.short_name)) return &o;
  return nullptr;
}

std::string unknown_option(const CommandSpec& spec, const std::string& name) {
  std::vector<std::string> names{"help"};
  for (const OptionSpec& o : spec.options) names.push_back(std::string(o.name).substr(2));
  size_t dashes = 0;
  while (dashes < name.size() && name[dashes] == '-') ++dashes;
  const std::string guess = nearest_name(name.substr(dashes), names);
  return "unknown option " + name + (guess.empty() ? "" : ": did you mean --" + guess + "?");
}

// What the option shows after its name: "N", "FILE", "text|json|torch"; "" for a flag.
std::string value_shown(const OptionSpec& o, bool in_synopsis) {
  if (o.kind == ValueKind::kFlag) return "";
  if (o.kind == ValueKind::kChoice && (in_synopsis || !o.value_name)) return joined_choices(o);
  return o.value_name ? o.value_name : "VALUE";
}

std::string synopsis_token(const OptionSpec& o) {
  const std::string v = value_shown(o, true);
  std::string t = std::string(o.required && o.short_name ? o.short_name : o.name) + (v.empty() ? "" : " " + v);
  if (!o.required) t = "[" + t + "]";
  return o.repeatable ? t + "..." : t;
}

// Appends `text` from column `col` (the current line already reaches it), wrapped at kWidth;
// '\n' starts a new line at `col`; a line indented after it is kept as written (a command to copy).
void append_wrapped(std::string* out, const std::string& text, size_t col) {
  size_t start = 0;
  bool first_line = true;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (!first_line) *out += "\n" + std::string(col, ' ');
    first_line = false;
    const size_t indent = col + std::min(line.find_first_not_of(' '), line.size());
    *out += std::string(indent - col, ' ');
    size_t pos = indent;
    bool first_word = true;
    size_t i = indent - col;
    while (i < line.size()) {
      const size_t word_end = std::min(line.find(' ', i), line.size());
      const std::string word = line.substr(i, word_end - i);
      if (!word.empty()) {
        if (!first_word && pos + 1 + word.size() > kWidth && indent == col) {
          *out += "\n" + std::string(indent, ' ');
          pos = indent;
        } else if (!first_word) {
          *out += ' ';
          ++pos;
        }
        *out += word;
        pos += word.size();
        first_word = false;
      }
      i = word_end + 1;
    }
    start = end + 1;
  }
  *out += "\n";
}

// `left` padded to `col`, or on a line of its own when it reaches the column; then `text`.
void append_entry(std::string* out, const std::string& left, size_t col, const std::string& text) {
  *out += left;
  if (left.size() + 2 > col) *out += "\n" + std::string(col, ' ');
  else *out += std::string(col - left.size(), ' ');
  append_wrapped(out, text, col);
}

std::string ordinal_count(size_t n) { return std::to_string(n) + (n == 1 ? " input" : " inputs"); }

}  // namespace

const OptionSpec& Cli::spec(const std::string& name) const {
  if (command_)
    if (const OptionSpec* o = find_option(*command_, name)) return *o;
  throw std::logic_error("internal error: option " + name + " is not declared");
}

std::string Cli::text(const std::string& name) const {
  const OptionSpec& o = spec(name);
  auto it = values_.find(name);
  if (it != values_.end() && !it->second.empty()) return it->second.back();
  return o.fallback ? o.fallback : "";
}

uint64_t Cli::count(const std::string& name) const {
  const std::string v = text(name);
  return v.empty() ? 0 : std::strtoull(v.c_str(), nullptr, 10);
}

double Cli::number(const std::string& name) const {
  const std::string v = text(name);
  return v.empty() ? 0 : std::strtod(v.c_str(), nullptr);
}

uint64_t Cli::bytes(const std::string& name) const {
  uint64_t b = 0;
  parse_bytes(text(name), &b);
  return b;
}

const std::vector<std::string>& Cli::all(const std::string& name) const {
  static const std::vector<std::string> kNone;
  spec(name);
  auto it = values_.find(name);
  return it == values_.end() ? kNone : it->second;
}

bool parse_cli(const CommandSpec& spec, const std::vector<std::string>& args, Cli* out, std::string* error) {
  Cli cli;
  cli.command_ = &spec;
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == "-h" || a == kHelpName) {
      cli.values_[kHelpName];
      *out = std::move(cli);
      return true;
    }
  }
  bool only_operands = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_operands || a.empty() || a[0] != '-' || a == "-") {
      cli.operands.push_back(a);
      continue;
    }
    if (a == "--") {
      only_operands = true;
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (const size_t eq = a.find('='); eq != std::string::npos && starts_with(a, "--")) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    const OptionSpec* o = find_option(spec, name);
    if (!o) {
      *error = unknown_option(spec, name);
      return false;
    }
    if (!o->repeatable && cli.values_.count(o->name)) {
      *error = std::string(o->name) + " is given twice (each option may be given once)";
      return false;
    }
    if (o->kind == ValueKind::kFlag) {
      if (inline_value) {
        *error = std::string(o->name) + " takes no value";
        return false;
      }
      cli.values_[o->name];
      continue;
    }
    if (!inline_value) {
      // `-o --json`: the value is missing, not "--json".
      if (i + 1 >= args.size() || starts_with(args[i + 1], "--")) {
        *error = name + " needs a value (" + name + " " + value_shown(*o, false) + ")";
        return false;
      }
      value = args[++i];
    }
    if (!check_value(*o, &value, error)) return false;
    cli.values_[o->name].push_back(std::move(value));
  }
  for (const OptionSpec& o : spec.options)
    if (o.required && !cli.has(o.name)) {
      *error = std::string(o.short_name ? o.short_name : o.name) + " " + value_shown(o, true) + " is required";
      if (o.kind == ValueKind::kFlag) error->erase(error->find(' '), 1);
      return false;
    }
  const size_t n = cli.operands.size();
  if (n < spec.min_operands || n > spec.max_operands) {
    *error = "expects " + std::string(spec.operands) + " (" + ordinal_count(n) + " given)";
    return false;
  }
  // Standard input gives its bytes once: a second "-" was read as empty ("- is empty").
  if (std::count(cli.operands.begin(), cli.operands.end(), "-") > 1) {
    *error = "'-' (standard input) is given more than once: it can be read only once";
    return false;
  }
  *out = std::move(cli);
  return true;
}

std::string help_text(const CommandSpec& spec) {
  std::string head = std::string("usage: gpushim-analyze ") + spec.name;
  std::vector<std::string> tokens;
  for (const OptionSpec& o : spec.options)
    if (o.required) tokens.push_back(synopsis_token(o));
  if (*spec.operands) tokens.push_back(spec.operands);
  for (const OptionSpec& o : spec.options)
    if (!o.required) tokens.push_back(synopsis_token(o));
  std::string synopsis;
  for (const std::string& t : tokens) synopsis += (synopsis.empty() ? "" : " ") + t;
  // Wrapped at option boundaries, not inside "[--top N]".
  std::string out = head;
  size_t pos = head.size();
  for (const std::string& t : tokens) {
    if (pos + 1 + t.size() > kWidth && pos > head.size()) {
      out += "\n" + std::string(head.size(), ' ');
      pos = head.size();
    }
    out += " " + t;
    pos += 1 + t.size();
  }
  out += "\n";
  if (*spec.description) out += "\n" + std::string(spec.description);
  if (!out.empty() && out.back() != '\n') out += "\n";

  std::vector<std::pair<std::string, const OptionSpec*>> rows;
  for (const OptionSpec& o : spec.options) {
    const std::string v = value_shown(o, false);
    rows.emplace_back("  " + (o.short_name ? std::string(o.short_name) + ", " : "") + o.name + (v.empty() ? "" : " " + v), &o);
  }
  rows.emplace_back("  -h, --help", nullptr);
  size_t col = 0;
  for (const auto& r : rows)
    if (r.first.size() <= 22) col = std::max(col, r.first.size());
  col += 2;
  out += "\noptions:\n";
  for (const auto& [left, o] : rows) {
    if (!o) {
      append_entry(&out, left, col, "this help");
      continue;
    }
    // "(default X)" ends the help, or comes before the colon that introduces the choices.
    std::string text = o->help;
    const bool colon = !text.empty() && text.back() == ':';
    if (colon) text.pop_back();
    if (o->fallback) text += std::string(text.empty() ? "" : " ") + "(default " + o->fallback + ")";
    if (o->repeatable) text += std::string(text.empty() ? "" : " ") + "(repeatable)";
    if (colon) text += ":";
    append_entry(&out, left, col, text);
    size_t width = 0;
    for (const Choice& c : o->choices)
      if (c.help) width = std::max(width, std::strlen(c.name));
    for (const Choice& c : o->choices)
      if (c.help) {
        const std::string name = std::string(col + 2, ' ') + c.name;
        append_entry(&out, name, col + 2 + width + 2, c.help);
      }
  }
  return out;
}

std::string commands_text(const std::vector<const CommandSpec*>& specs) {
  constexpr size_t kCol = 32;
  std::string out;
  for (const CommandSpec* s : specs) {
    std::string left = std::string("  ") + s->name;
    for (const OptionSpec& o : s->options)
      if (o.required) left += " " + synopsis_token(o);
    if (*s->operands) left += std::string(" ") + s->operands;
    append_entry(&out, left, kCol, s->summary);
  }
  return out;
}

int run_command(const CommandSpec& spec, const std::vector<std::string>& args) {
  Cli cli;
  std::string error;
  if (!parse_cli(spec, args, &cli, &error)) return usage_error(spec.name, error);
  if (cli.has(kHelpName)) {
    const std::string help = help_text(spec);
    std::fwrite(help.data(), 1, help.size(), stdout);
    return 0;
  }
  return spec.run(cli);
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.size() < 3) return "";  // "-o" is two edits from "top": too short to guess from
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    // Optimal string alignment distance: Levenshtein plus the swap of two neighbours.
    const size_t n = word.size(), m = c.size();
    std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
    for (size_t x = 0; x <= n; ++x) d[x][0] = x;
    for (size_t y = 0; y <= m; ++y) d[0][y] = y;
    for (size_t x = 1; x <= n; ++x)
      for (size_t y = 1; y <= m; ++y) {
        size_t v = std::min({d[x - 1][y] + 1, d[x][y - 1] + 1, d[x - 1][y - 1] + (word[x - 1] != c[y - 1])});
        if (x > 1 && y > 1 && word[x - 1] == c[y - 2] && word[x - 2] == c[y - 1]) v = std::min(v, d[x - 2][y - 2] + 1);
        d[x][y] = v;
      }
    if (d[n][m] < best_distance) {
      best_distance = d[n][m];
      best = c;
    }
  }
  return best_distance <= std::max<size_t>(2, word.size() / 3) ? best : "";
}

bool write_output(const std::string& path, const std::string& data, std::string* error) {
  if (path == "-") {
    errno = 0;
    if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size() || std::fflush(stdout) != 0) {
      *error = std::string("cannot write to stdout") + (errno ? std::string(": ") + std::strerror(errno) : "");
      return false;
    }
    return true;
  }
  // A regular file is written beside its place and renamed over it, so that a failed write (a full
  // disk, an interrupt) leaves the user's earlier output whole instead of a truncated one. What is
  // not a regular file (/dev/stdout, a pipe, /dev/full) cannot be replaced: it is written in place.
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) {
      *error = "cannot create " + path + ": " + std::strerror(errno);
      return false;
    }
    int err = write_fully(fd, data.data(), data.size());
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) {
      *error = "cannot write " + path + ": " + std::strerror(err);
      return false;
    }
    return true;
  }
  // A symbolic link stays a link: the file it names is the one replaced.
  std::string target = path;
  if (exists) {
    if (char* real = ::realpath(path.c_str(), nullptr)) {
      target = real;
      std::free(real);
    }
  }
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : target.substr(0, slash));
  const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  std::string temp = dir + "/." + base + ".XXXXXX";
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  // mkostemp makes the file 0600; the output gets the mode a plain create would give it (or keeps
  // the one the replaced file had).
  mode_t mode = st.st_mode & 07777;
  if (!exists) {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0644 & ~mask;
  }
  int err = write_fully(fd, data.data(), data.size());
  if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), target.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    *error = "cannot write " + path + ": " + std::strerror(err);
    return false;
  }
  return true;
}

int print_output(const char* cmd, const std::string& data) {
  std::string error;
  if (write_output("-", data, &error)) return 0;
  std::fprintf(stderr, "gpushim-analyze %s: %s\n", cmd, error.c_str());
  return 1;
}

bool parse_size(const std::string& text, uint64_t* out) { return parse_bytes(text, out); }

int usage_error(const char* cmd, const std::string& message) {
  std::fprintf(stderr, "gpushim-analyze %s: %s (gpushim-analyze %s --help)\n", cmd, message.c_str(), cmd);
  return 2;
}

}  // namespace gpushim::analysis
