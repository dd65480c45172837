"""The README and docs/ quote the command lines of gpushim-analyze, the launcher and gpushim-plot:
every command, option and export format they quote must be one the tool's own --help lists (and a
launcher option that sets a variable must name one the library knows), so the docs cannot drift
from the tools."""
import glob
import os
import re
import subprocess
import unittest

from shimtest import BIN

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ANALYZE = os.path.join(BIN, "gpushim-analyze")
LAUNCHER = os.path.join(ROOT, "scripts", "gpushim")
PLOT = os.path.join(ROOT, "scripts", "gpushim-plot")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def help_of(*cmd):
    proc = subprocess.run(list(cmd) + ["--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (cmd, proc.stderr)
    return proc.stdout


def library_knows(var):
    """Whether libgpushim.so's configuration table has `var` (asked through its own parser, with no
    other GPUSHIM_* variable around)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHIM_")}
    check = subprocess.run([ANALYZE, "config", "--check", var + "="], capture_output=True, text=True, env=env)
    return "is not a gpushim variable" not in check.stderr


def quotes(pattern):
    """(file, line number, match) for every quote of `pattern` in the docs."""
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for m in re.finditer(pattern, line):
                    yield os.path.relpath(path, ROOT), n, m


def options(text):
    """The --options of a quoted command line, up to a lone "--" (after it comes the program)."""
    text = re.split(r"\s--(?:\s|$)", text)[0]
    return re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text)


class DocsMatchHelp(unittest.TestCase):
    def test_gpushim_analyze_commands_and_options(self):
        top = help_of(ANALYZE)
        commands = set(re.findall(r"^  ([a-z][a-z-]*) ", top, re.M))
        self.assertLessEqual({"summary", "replay", "diff", "merge", "export", "config"}, commands)
        helps = {c: help_of(ANALYZE, c) for c in commands}
        seen = 0
        for where, n, m in quotes(r"gpushim-analyze ([a-z][a-z-]*)((?:[^`\n|]|\|(?=[a-z]))*)"):
            cmd, rest = m.group(1), m.group(2)
            if cmd not in commands:
                continue  # prose: "gpushim-analyze reads ..."
            seen += 1
            for opt in options(rest):
                self.assertIn(opt, helps[cmd], f"{where}:{n}: gpushim-analyze {cmd} has no {opt}")
        self.assertGreater(seen, 3)

    def test_export_formats(self):
        helps = help_of(ANALYZE, "export")
        # The formats are the choices listed under --format, down to the next option.
        block = re.search(r"^  --format .*?\n(.*?)^  -", helps, re.M | re.S).group(1)
        listed = set(re.findall(r"^ {4,}([a-z][a-z-]*)  +\S", block, re.M))
        self.assertLessEqual({"memory-viz", "folded", "speedscope", "perfetto", "perfetto-json", "timeline"}, listed)
        seen = 0
        for where, n, m in quotes(r"--format ([a-z][a-z|-]*[a-z])"):
            for fmt in m.group(1).split("|"):
                if fmt in ("text", "json", "torch"):  # summary's formats
                    self.assertIn(fmt, help_of(ANALYZE, "summary"), f"{where}:{n}")
                    continue
                seen += 1
                self.assertIn(fmt, listed, f"{where}:{n}: export has no format {fmt}")
        self.assertGreater(seen, 3)
        # The top-level usage quotes the same list.
        top = re.search(r"export --format ([a-z|-]+)", help_of(ANALYZE)).group(1).split("|")
        self.assertEqual(set(top), listed)

    def test_launcher_options(self):
        launcher_help = help_of(LAUNCHER)
        own = set(re.findall(r"^  (--[a-z-]+)", launcher_help, re.M)) | {"-h", "--help", "--version"}
        seen = 0
        for where, n, m in quotes(r"gpushim run ([^`\n]*)"):
            seen += 1
            for opt in options(m.group(1)):
                if opt in own:
                    continue
                # Any other option sets GPUSHIM_<NAME>: the library must know the name.
                var = "GPUSHIM_" + opt[2:].upper().replace("-", "_")
                self.assertTrue(library_knows(var), f"{where}:{n}: {opt}")
        self.assertGreater(seen, 2)
        for opt in options(re.search(r"for example\n(.*?)\nThe README", launcher_help, re.S).group(1)):
            var = "GPUSHIM_" + opt[2:].upper().replace("-", "_")
            self.assertTrue(library_knows(var), f"gpushim --help quotes {opt}")

    def test_plot_options(self):
        plot_help = help_of("/usr/bin/python3", PLOT)
        seen = 0
        for where, n, m in quotes(r"gpushim-plot ([^`\n]*)"):
            seen += 1
            for opt in options(m.group(1)):
                self.assertIn(opt, plot_help, f"{where}:{n}: gpushim-plot has no {opt}")
        self.assertGreater(seen, 0)


if __name__ == "__main__":
    unittest.main()


class ToolVariables(unittest.TestCase):
    """The GPUSHIM_* variables the project's own tools and tests read (GPUSHIM_PYTHON, GPUSHIM_BUDGET,
    ...) are not the shim's, yet set in a job's environment they must not turn the shim off as an
    unknown name does (they did: gpushim-plot's GPUSHIM_PYTHON made the launcher refuse to run). The
    shim's list of them (interpose/config/config.cpp, tool_variable) must be what the tree reads."""

    ENV_READ = re.compile(r'(?:environ(?:\.get)?\(?\[?"|getenv\("|\$\{?)(GPUSHIM_[A-Z0-9_]+)')

    def read_in_tree(self):
        found = set()
        for top in ("scripts", "analysis", "bench", "tests"):
            for root, _, files in os.walk(os.path.join(ROOT, top)):
                for name in files:
                    if name == "CMakeLists.txt" or name.endswith(".cmake"):
                        continue  # CMake's variables, not the environment's
                    try:
                        with open(os.path.join(root, name), encoding="utf-8", errors="ignore") as f:
                            found.update(self.ENV_READ.findall(f.read()))
                    except OSError:
                        pass
        return found

    def test_every_variable_the_tools_read_leaves_the_shim_on(self):
        found = self.read_in_tree()
        self.assertIn("GPUSHIM_PYTHON", found)  # the scan sees what it should
        for name in sorted(found):
            with self.subTest(variable=name):
                self.assertTrue(library_knows(name), f"{name} would turn the shim off")

    def test_the_shims_list_is_what_the_tree_reads(self):
        with open(os.path.join(ROOT, "interpose", "config", "config.cpp"), encoding="utf-8") as f:
            src = f.read()
        listed = set(re.findall(r'^\s*"(GPUSHIM_[A-Z0-9_]+)",\s*//', src[src.index("bool tool_variable"):], re.M))
        self.assertGreater(len(listed), 5)
        self.assertEqual(sorted(listed - self.read_in_tree()), [], "listed but read nowhere any more")



class TraceFormatPage(unittest.TestCase):
    """docs/trace-format.md describes the version interpose/trace/trace_format.h writes: its title
    said 1.4 after the end record's teardown field made it 1.5."""

    def test_the_page_names_the_version_the_shim_writes(self):
        with open(os.path.join(ROOT, "interpose", "trace", "trace_format.h"), encoding="utf-8") as f:
            code = f.read()
        major = re.search(r"kVersionMajor = (\d+);", code).group(1)
        minor = re.search(r"kVersionMinor = (\d+);", code).group(1)
        with open(os.path.join(ROOT, "docs", "trace-format.md"), encoding="utf-8") as f:
            page = f.read()
        self.assertEqual(re.match(r"# gpushim trace format \(version (\d+)\.(\d+)\)", page).groups(), (major, minor))
        self.assertIn(f"| 1 | header | varint major ({major}), varint minor ({minor};", page)
