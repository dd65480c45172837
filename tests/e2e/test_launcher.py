"""End-to-end tests of the launcher, `gpushim run [options] -- cmd ...` (scripts/gpushim, copied to
build/bin/gpushim): it preloads the library and turns options into GPUSHIM_* variables;
--torch-alloc is GPUSHIM_TORCH_ALLOC, with which the library itself sets
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (or, on request, PYTORCH_NO_CUDA_MEMORY_CACHING=1)
in every process it is preloaded into (test_torch_routing.py)."""
import json
import os
import re
import subprocess
import tempfile
import unittest

from pythons import interpreters
from shimtest import BIN, BUILD, PRELOAD_FIRST, SANITIZER, SHIM, base_env, check_sanitizer_clean

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(BIN, "gpushim")                                  # build tree: finds ../lib
SOURCE_LAUNCHER = os.path.join(HERE, "..", "..", "scripts", "gpushim")  # source tree
SHOW_ENV = os.path.join(HERE, "python", "show_env.py")
# A native command that prints its environment. TSan builds: an instrumented stand-in, as a
# TSan-built shim loads into no other program (stand_ins/env.cpp).
ENV_PROGRAM = os.path.join(BUILD, "stand-ins", "env") if SANITIZER == "thread" else "/usr/bin/env"


def existing_preloads(preload=""):
    """LD_PRELOAD as the launcher finds it: `preload`, behind what sanitizer builds preload first
    (shimtest.PRELOAD_FIRST: ASan's runtime, or TSan's two Abseil libraries)."""
    return ":".join(p for p in (PRELOAD_FIRST, preload) if p)


# The user's own PyTorch allocator settings, which the launcher keeps: dropped by default here.
TORCH_VARS = ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF")


def launch(args, env_extra=None, launcher=LAUNCHER, drop=TORCH_VARS):
    env = base_env(preload=False)  # the launcher sets LD_PRELOAD itself
    for k in drop:
        env.pop(k, None)
    env.update(env_extra or {})
    if PRELOAD_FIRST:
        # ASan builds: the instrumented shim needs the ASan runtime in the program's preload list,
        # and the launcher puts the shim first (what these tests check), ahead of preloads already
        # there. The shim depends on that runtime, which is thus initialized before it, and defines
        # none of the runtime's symbols: the order is sound, so ASan's own check of it is turned
        # off. The launcher is a bash script, and bash does not free its memory at exit: no leak
        # check in these tests (the shim's leaks are checked everywhere else).
        env["LD_PRELOAD"] = existing_preloads(env.get("LD_PRELOAD", ""))
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0:detect_leaks=0"
    wd = tempfile.mkdtemp(prefix="gpushim-launcher-")
    proc = subprocess.run([launcher] + args, env=env, cwd=wd, capture_output=True, text=True, timeout=120)
    check_sanitizer_clean(proc.stderr, launcher)
    return proc, wd


class Launcher(unittest.TestCase):
    def test_python_command_runs_under_the_shim_with_torch_async_allocator(self):
        python = interpreters()[0][0]
        wd = tempfile.mkdtemp(prefix="gpushim-launcher-")
        report = os.path.join(wd, "r.%p.json")
        proc, _ = launch(["run", "--policy", "passthrough", "--report", report, "--stack-depth=12",
                          "--sample-ms", "7", "--", python, SHOW_ENV])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        env = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(env["PYTORCH_CUDA_ALLOC_CONF"], "backend:cudaMallocAsync")
        self.assertNotIn("PYTORCH_NO_CUDA_MEMORY_CACHING", env)
        self.assertEqual(env["GPUSHIM_POLICY"], "passthrough")
        self.assertEqual(env["GPUSHIM_STACK_DEPTH"], "12")
        self.assertEqual(env["GPUSHIM_SAMPLE_MS"], "7")
        self.assertEqual(env["LD_PRELOAD"].split(":")[0], os.path.realpath(SHIM))
        files = os.listdir(wd)
        self.assertEqual(len(files), 1, files)
        with open(os.path.join(wd, files[0])) as f:
            rep = json.load(f)
        self.assertEqual(rep["policy"], "passthrough")
        self.assertEqual(rep["stack_depth"], 12)
        self.assertEqual(rep["devices"][0]["live_bytes"], 1 << 20)
        self.assertTrue(any(fr["kind"] == "python" for s in rep["sites"] for fr in s["frames"]))
        version, _ = launch(["--version"])
        self.assertEqual(version.stdout.split()[1], rep["version"])  # the report names the release

    def test_torch_alloc_choices_and_the_users_own_setting(self):
        python = interpreters()[0][0]

        def run(args, env=None):
            proc, _ = launch(["run"] + args + ["--report", "off", "--", python, SHOW_ENV], env)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            # The launcher's lines about PyTorch (the shim's summary follows on stderr).
            torch_lines = "".join(l + "\n" for l in proc.stderr.splitlines() if "PYTORCH_" in l)
            return {k: v for k, v in got.items() if k.startswith("PYTORCH_")}, torch_lines

        self.assertEqual(run(["--keep-torch-cache"]), ({}, ""))
        self.assertEqual(run(["--torch-alloc", "keep"]), ({}, ""))
        self.assertEqual(run(["--torch-alloc=no-cache"]), ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, ""))
        self.assertEqual(run(["--torch-alloc", "async"]), ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, ""))
        # The user's setting is kept (the report, not the launcher, says when it keeps PyTorch's
        # cache in charge: only a process that loaded PyTorch has one).
        self.assertEqual(run([], {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,foo:1"}),
                         ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,foo:1"}, ""))
        for mine in ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}):
            self.assertEqual(run([], mine), (mine, ""))
            self.assertEqual(run(["--torch-alloc", "keep"], mine), (mine, ""))
        self.assertEqual(run(["--torch-alloc", "no-cache"], {"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}),
                         ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}, ""))
        proc, _ = launch(["run", "--torch-alloc", "sometimes", "--", python, SHOW_ENV])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("gpushim: GPUSHIM_TORCH_ALLOC='sometimes' is invalid: expected async, no-cache or keep",
                      proc.stderr)

    def test_the_choice_is_the_librarys_for_every_command(self):
        # The launcher only passes the choice on; no guessing which commands are Python ones.
        def dry(args):
            proc, _ = launch(["run", "--dry-run"] + args)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            return [l for l in proc.stdout.splitlines() if "TORCH" in l and "=" in l and " " not in l]

        for cmd in ("python3", "torchrun", "/bin/true", "./train"):
            self.assertEqual(dry(["--", cmd]), [], cmd)
            self.assertEqual(dry(["--torch-alloc", "no-cache", "--", cmd]), ["GPUSHIM_TORCH_ALLOC=no-cache"], cmd)
            self.assertEqual(dry(["--keep-torch-cache", "--", cmd]), ["GPUSHIM_TORCH_ALLOC=keep"], cmd)
        # --python is still accepted (old scripts), and changes nothing.
        self.assertEqual(dry(["--python", "--", "/bin/true"]), [])

    def test_native_command_and_existing_preloads(self):
        proc, wd = launch(["run", "--report", "off", "--", ENV_PROGRAM], {"LD_PRELOAD": "libm.so.6"})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        env = dict(l.split("=", 1) for l in proc.stdout.splitlines() if "=" in l)
        self.assertEqual(env["LD_PRELOAD"], os.path.realpath(SHIM) + ":" + existing_preloads("libm.so.6"))
        self.assertEqual(env["GPUSHIM_REPORT"], "off")
        # The library routes PyTorch in every process it is preloaded into; nothing else happens
        # without CUDA: no report, no output from the shim.
        self.assertNotIn("PYTORCH_NO_CUDA_MEMORY_CACHING", env)
        self.assertEqual(env["PYTORCH_CUDA_ALLOC_CONF"], "backend:cudaMallocAsync")
        self.assertEqual(os.listdir(wd), [])
        self.assertEqual(proc.stderr, "")

    def test_unknown_option_is_refused_before_running_anything(self):
        proc, wd = launch(["run", "--frobnicate", "caching", "--", "/usr/bin/touch", "ran"])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("GPUSHIM_FROBNICATE", proc.stderr)
        self.assertIn("GPUSHIM_POLICY", proc.stderr)  # nothing near: lists the known names
        self.assertEqual(os.listdir(wd), [])
        for bad in (["run"], ["run", "--policy", "caching"], ["frobnicate", "--", "true"], ["run", "-x", "true"]):
            proc, _ = launch(bad)
            self.assertEqual(proc.returncode, 2, bad)
            self.assertTrue(proc.stderr.startswith("gpushim: ") or "usage" in proc.stderr, proc.stderr)

    def test_first_word_that_is_not_an_option_starts_the_command(self):
        # As compute-sanitizer and heaptrack: no '--' needed; what follows is the program's, even
        # words that look like the launcher's options.
        proc, wd = launch(["run", "--report", "off", ENV_PROGRAM])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("GPUSHIM_REPORT=off", proc.stdout.splitlines())
        proc, _ = launch(["run", "--dry-run", "--policy=vmm", "/bin/echo", "--policy", "caching", "--", "x"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertIn("GPUSHIM_POLICY=vmm", lines)
        self.assertEqual(lines[-1].split(), ["/bin/echo", "--policy", "caching", "--", "x"])
        proc, _ = launch(["run", "--dry-run", "/bin/echo"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.splitlines()[-1].split(), ["/bin/echo"])

    def test_dry_run_listing_pastes_into_a_shell_as_it_is(self):
        # The variables are quoted like the command: pasted, a value with a space, ';' or '$' sets
        # exactly that value and runs nothing else (unquoted, 'x;touch PWNED' ran touch).
        report = "x;touch PWNED $HOME `id`"
        proc, wd = launch(["run", "--dry-run", "--limit", "1 GiB", "--report", report, "--",
                           "printenv", "GPUSHIM_LIMIT", "GPUSHIM_REPORT"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertIn("GPUSHIM_LIMIT=1\\ GiB", lines)
        # LD_PRELOAD left out: printenv need not run under the shim to show what the shell set.
        pasted = " ".join(l for l in lines if not l.startswith("LD_PRELOAD="))
        shell = subprocess.run(["bash", "-c", pasted], cwd=wd, capture_output=True, text=True, timeout=60)
        self.assertEqual(shell.returncode, 0, shell.stderr)
        self.assertEqual(shell.stdout.splitlines(), ["1 GiB", report])
        self.assertEqual(os.listdir(wd), [])

    def test_misspelt_option_suggests_the_nearest_name(self):
        for args, guess in ((["--polcy", "caching"], "--policy"),
                            (["--stack-dept=4"], "--stack-depth"),
                            (["--sampel-ms", "5"], "--sample-ms"),
                            (["--dryrun"], "--dry-run"),            # a launcher option (takes the command as its value)
                            (["--error-exitcod", "3"], "--error-exitcode")):
            with self.subTest(args=args):
                proc, wd = launch(["run"] + args + ["/usr/bin/touch", "ran"])
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertEqual(proc.stderr.splitlines()[0],
                                 "gpushim: unknown option %s: did you mean %s? (gpushim run --help)"
                                 % (args[0].split("=")[0], guess))
                self.assertEqual(os.listdir(wd), [])

    def test_repeated_option_is_refused(self):
        for args, name in ((["--policy", "vmm", "--policy", "caching"], "--policy"),
                           (["--report=off", "--report", "r.json"], "--report"),
                           (["--keep-torch-cache", "--torch-alloc", "async"], "--torch-alloc"),
                           (["--error-exitcode", "3", "--exit-code=4"], "--error-exitcode"),
                           (["--dry-run", "--dry-run"], "--dry-run")):
            with self.subTest(args=args):
                proc, wd = launch(["run"] + args + ["--", "/usr/bin/touch", "ran"])
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertEqual(proc.stderr, "gpushim: %s is given twice (each option may be given once)\n" % name)
                self.assertEqual(os.listdir(wd), [])

    def test_source_tree_launcher_with_explicit_library(self):
        proc, _ = launch(["run", "--lib", SHIM, "--dry-run", "--", "true"], launcher=SOURCE_LAUNCHER)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("LD_PRELOAD=" + os.path.realpath(SHIM), proc.stdout)
        proc, _ = launch(["run", "--lib", "/nonexistent/libgpushim.so", "--", "true"], launcher=SOURCE_LAUNCHER)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no such file", proc.stderr)
        # A file that is not the library: the loader would skip it and the command run without the
        # shim, exit status 0.
        # gpushim's own programs carry its version string too, but are programs, not libraries.
        for other in ("/etc/passwd", "/bin/true", os.path.join(BIN, "gpushim-analyze")):
            proc, _ = launch(["run", "--lib", other, "--", "true"], launcher=SOURCE_LAUNCHER)
            self.assertEqual(proc.returncode, 2, other)
            self.assertEqual(proc.stderr, f"gpushim: --lib {os.path.realpath(other)}: not a gpushim library (not a "
                                          "shared object carrying a gpushim version)\n")

    def test_help(self):
        proc, _ = launch(["--help"])
        self.assertEqual(proc.returncode, 0)
        self.assertIn("gpushim run [options] [--] command", proc.stdout)
        self.assertIn("--keep-torch-cache", proc.stdout)
        self.assertIn("--torch-alloc async|no-cache|keep", proc.stdout)
        self.assertIn("caching|vmm|passthrough", proc.stdout)
        self.assertNotIn("when available", proc.stdout)
        self.assertIn("--version", proc.stdout)

    def test_bad_values_are_refused_with_the_librarys_message_before_running_anything(self):
        for args, env, message in (
                (["--policy", "fast"], {}, "GPUSHIM_POLICY='fast' is invalid: expected caching, vmm or passthrough"),
                (["--limit=lots"], {}, "GPUSHIM_LIMIT='lots' is invalid: expected bytes with units"),
                # Bytes: below 1 MiB no allocation fits, so 8 meant something else.
                (["--limit", "8"], {}, "GPUSHIM_LIMIT='8' is invalid: expected bytes with units"),
                (["--stack-depth", "-1"], {}, "GPUSHIM_STACK_DEPTH='-1' is invalid"),
                ([], {"GPUSHIM_SAMPLE_MS": "0"}, "GPUSHIM_SAMPLE_MS='0' is invalid"),  # from the environment
                (["--report", "off", "--dry-run", "--fail", "nth:x"], {}, "GPUSHIM_FAIL='nth:x' is invalid")):
            with self.subTest(args=args, env=env):
                proc, wd = launch(["run"] + args + ["--", "/usr/bin/touch", "ran"], env)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn("gpushim: " + message, proc.stderr)
                self.assertEqual(os.listdir(wd), [])  # nothing ran
                self.assertEqual(proc.stdout, "")  # not even --dry-run's listing
        # The values the library accepts pass, whatever their spelling.
        proc, _ = launch(["run", "--dry-run", "--policy", "VMM", "--limit", "60%", "--report=off", "--", "/bin/true"])
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def test_a_number_and_its_unit_given_apart_are_refused(self):
        # `--limit 8 GiB` took GiB for the command ("GiB: command not found") and 8 for bytes.
        for args in (["--limit", "8", "GiB"], ["--large-segment", "10", "MiB", "--"], ["--limit", "1.5", "g"]):
            with self.subTest(args=args):
                proc, wd = launch(["run"] + args + ["/usr/bin/touch", "ran"])
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertRegex(proc.stderr, r"^gpushim: --\S+ [0-9.]+ \w+: write the number and its unit as one word")
                self.assertEqual(os.listdir(wd), [])

    def test_every_argument_shape_gets_the_launchers_own_message(self):
        # An option whose value is missing: "--" is never taken as the value.
        for args in (["--report", "--", "true"], ["--report"], ["--policy", "--report", "off", "--", "true"]):
            with self.subTest(args=args):
                proc, wd = launch(["run"] + args)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertRegex(proc.stderr, r"^gpushim: --(report|policy) needs a value")
                self.assertEqual(os.listdir(wd), [])
        d = tempfile.mkdtemp()
        plain = os.path.join(d, "not-executable")
        open(plain, "w").close()
        for command, status, message in (("/nonexistent/train", 127, "/nonexistent/train: no such file"),
                                         ("gpushim-no-such-program", 127, "gpushim-no-such-program: command not found"),
                                         (d, 126, d + ": is a directory"),
                                         (plain, 126, plain + ": permission denied"),
                                         ("", 127, "the command is an empty string")):
            with self.subTest(command=command):
                proc, _ = launch(["run", "--report", "off", "--", command])
                self.assertEqual(proc.returncode, status, proc.stderr)
                self.assertTrue(proc.stderr.startswith("gpushim: " + message), proc.stderr)
                self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)  # one line, not bash's
        proc, _ = launch(["run", "--report", "off", "--"])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("gpushim: no command to run", proc.stderr)

    def test_version_names_the_library_it_would_preload(self):
        for args in (["--version"], ["run", "--version"]):
            proc, _ = launch(args)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertRegex(proc.stdout, r"^gpushim \d+\.\d+\.\d+ \(" + re.escape(os.path.realpath(SHIM)) + r"\)\n$")
        analyzer = subprocess.run([os.path.join(BIN, "gpushim-analyze"), "--version"], capture_output=True, text=True)
        self.assertEqual(analyzer.returncode, 0)
        self.assertEqual(analyzer.stdout.split()[1], proc.stdout.split()[1])


if __name__ == "__main__":
    unittest.main()
