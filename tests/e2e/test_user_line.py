"""Every printed stack leads with the user's own line, however deep the library stack above it:
the stderr summary, the OOM advice, and gpushim-analyze summary, diff and merge. The JSON keeps
every frame (stacks/frame_roles.h)."""
import os
import subprocess
import tempfile

from pythons import interpreters
from shimtest import BIN, ShimTestCase, check_sanitizer_clean, run

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "deep_library_user.py")
ANALYZE = os.path.join(BIN, "gpushim-analyze")


def user_line(analyzer=False):
    """The user's line as the stderr summary (or gpushim-analyze) prints it."""
    with open(PROGRAM) as f:
        n = [i for i, l in enumerate(f, 1) if l.rstrip().endswith("# @user")][0]
    return f"train_step deep_library_user.py:{n}" if analyzer else f"train_step (deep_library_user.py:{n})"


def analyze(*args):
    proc = subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=120)
    check_sanitizer_clean(proc.stderr, "gpushim-analyze")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


class UserLineFirst(ShimTestCase):
    def run_program(self, steps, *extra, env=None):
        lib_dir = tempfile.mkdtemp(prefix="gpushim-deeplib-")
        return run([interpreters()[0][0], PROGRAM, lib_dir, str(steps), *extra], env=env)

    def test_deep_library_stack(self):
        r = self.run_program(4)
        self.assertRanOK(r)
        site = r.report["sites"][0]
        # The JSON keeps every frame: the sixteen library layers sit inside the user's line.
        names = [f["function"] for f in site["frames"]]
        self.assertEqual(sum(n.startswith("layer") for n in names), 16, names)
        self.assertIn("ffi_call", names)
        # The stderr summary leads with the user's line, then its callers.
        block = r.stderr[r.stderr.index("top live allocation sites"):]
        at = [l.split("at ", 1)[1] for l in block.splitlines() if l.startswith("gpushim:       at ")]
        self.assertEqual(at[0], user_line(), r.stderr)
        self.assertTrue(at[1].startswith("main (deep_library_user.py:"), at)
        self.assertFalse(any(a.startswith("layer") or "ffi" in a for a in at), at)

        # gpushim-analyze summary, merge and diff.
        text = analyze("summary", r.report_path)
        shown = [l.strip() for l in text.splitlines() if l.strip().startswith("at ")]
        self.assertEqual(shown[0], "at " + user_line(analyzer=True), text)
        self.assertNotIn("ffi_call", text)
        bigger = self.run_program(8)
        merged = analyze("merge", r.report_path, bigger.report_path)
        self.assertIn(user_line(analyzer=True), merged)
        self.assertNotIn("ffi_call", merged)
        diff = analyze("diff", r.report_path, bigger.report_path)
        shown = [l.strip() for l in diff.splitlines() if l.strip().startswith("at ")]
        self.assertEqual(shown[0], "at " + user_line(analyzer=True), diff)
        self.assertNotIn("layer", diff)

    def test_oom_advice_names_the_users_line(self):
        r = self.run_program(2, "oom", env={"GPUSHIM_LIMIT": "256MiB"})
        self.assertRanOK(r)
        self.assertTrue(r.report["ooms"], r.stderr)
        self.assertIn("(train_step at deep_library_user.py:", r.report["ooms"][0]["advice"])
