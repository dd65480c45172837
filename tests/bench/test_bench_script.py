"""scripts/bench, run quickly against this build: it measures every policy the shim accepts and
writes every section of the markdown report, keeping the hand-written part of an existing file."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("GPUSHIM_BUILD_DIR") or os.path.join(ROOT, "build"))


class BenchScript(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = os.path.join(tempfile.mkdtemp(prefix="gpushim-bench-test-"), "benchmarks.md")
        with open(cls.out, "w") as f:
            f.write("old numbers\n<!-- Everything below this line is hand-written and kept by scripts/bench. -->\n"
                    "\nAnalysis that must survive.\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSHIM_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        cls.proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench"), "--quick", "--no-build",
                                   "--repetitions", "2", "--build-dir", BUILD, "--out", cls.out], env=env, capture_output=True, text=True,
                                  timeout=600)
        with open(cls.out) as f:
            cls.text = f.read()
        cls.policies = subprocess.run([os.path.join(BUILD, "bin", "gpushim_bench_policies")], capture_output=True,
                                      text=True, check=True).stdout.split()

    def test_runs_and_keeps_the_hand_written_part(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr[-3000:])
        self.assertNotIn("old numbers", self.text)
        self.assertTrue(self.text.rstrip().endswith("Analysis that must survive."), self.text[-300:])

    def test_rewriting_one_section_keeps_the_others(self):
        # --python-stacks replaces its own section only: the RMM and corpus sections after it (a
        # rewrite once dropped the RMM section) and the hand-written part stay as they were.
        path = os.path.join(os.path.dirname(self.out), "one-section.md")
        with open(path, "w") as f:
            f.write(self.text)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSHIM_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench"), "--python-stacks", "--quick",
                               "--no-build", "--build-dir", BUILD, "--out", path], env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        with open(path) as f:
            after = f.read()
        rmm = self.text.index("<!-- rmm:begin")
        self.assertLess(self.text.index("## Python stacks"), rmm)  # the rewritten section comes first
        self.assertIn("<!-- corpus:begin", self.text[rmm:])
        self.assertEqual(after[after.index("<!-- rmm:begin"):], self.text[rmm:])

    def test_every_policy_at_every_depth_has_latencies(self):
        self.assertGreaterEqual(len(self.policies), 2)
        for p in self.policies:
            for depth in ("off", "32", "64"):
                rows = re.findall(rf"^\| {p}, stacks {depth} \| (.*)$", self.text, re.M)
                # Three pair tables (sync, async on a created stream, async on the legacy stream)
                # and the replay table.
                self.assertEqual(len(rows), 4, (p, depth))
                for r in rows[:3]:
                    self.assertRegex(r, r"^\d+(\.\d)?( µs| ms)? / \d+(\.\d)?( µs| ms)? \|")

    def test_every_section_is_filled(self):
        for heading in ("## Targets", "## Interposition overhead", "## Alloc+free pair latency: cudaMalloc+cudaFree",
                        "## Replay of a mixed-size pattern", "## Replay throughput of `gpushim-analyze replay`",
                        "## Utilization on fragmentation workloads", "## Host memory of the shim",
                        "## Start-up cost of the preload", "## RMM beside the shim",
                        "## Trace corpus: PyTorch's allocator and gpushim's pools on real models"):
            self.assertIn(heading, self.text)
        # Two runs of each latency benchmark: the targets give the lowest run's p50 and the median.
        self.assertIn("Every latency benchmark ran 2 times", self.text)
        for limit, depth in ((100, "off"), (500, "32")):
            m = re.search(rf"\| pair ≤ {limit} ns, stacks {depth} \| (\d+) ns \| (\d+) ns \| \*\*(yes|no)\*\*; \*\*(yes|no)\*\* \|",
                          self.text)
            self.assertIsNotNone(m, self.text[:3000])
            low, median = int(m.group(1)), int(m.group(2))
            self.assertLessEqual(low, median)
            self.assertEqual(m.group(3), "yes" if low <= limit else "no")
            self.assertEqual(m.group(4), "yes" if median <= limit else "no")
        self.assertRegex(self.text, r"\| cudaMalloc\+cudaFree 4 KiB \| \d+ ns \| \d+ ns \| -?\d+ ns \| -?\d+ ns \|")
        for p in self.policies:
            self.assertRegex(self.text, rf"\| {p} \| -?\d+ B \| -?\d+ B \| -?\d+ B \| -?\d+ B \|")
        # Start-up: wall p50 without and with the preload, their ratio, CPU time without / with, its
        # ratio, and the number of pairs, for /bin/true and python3 -c pass.
        startup = re.findall(r"^\| `[^`]+` \| \d+ µs \| \d+ µs \| \d+\.\d\d× \| \d+ / \d+ µs \| \d+\.\d\d× \| \d+ \|$",
                             self.text, re.M)
        self.assertEqual(len(startup), 2, self.text[self.text.find("## Start-up"):][:1500])
        frag = re.findall(r"^\| (varying_length_training|growing_buffer|random_churn) \| \d+ MiB \| (.*)$", self.text, re.M)
        self.assertEqual(len(frag), 3)
        for _, cells in frag:
            self.assertEqual(len(re.findall(r"\d+\.\d%", cells)), 1 + 2 * len(self.policies), cells)

    def test_driver_calls_of_every_configuration_side_by_side(self):
        rows = re.findall(r"^\| (varying_length_training|growing_buffer|random_churn) \| \d+ \| ([\w ()]+) \| \d+ MiB \| "
                          r"\d+\.\d% \| (\d+) \| (\d+) \| (\d+|—) \| (\d+|—) \| (\d+) \|$", self.text, re.M)
        self.assertEqual(len(rows), 3 * (1 + len(self.policies)), self.text)
        by = {(w, c): (int(a), int(f), m, u, int(s)) for w, c, a, f, m, u, s in rows}
        for w in ("varying_length_training", "growing_buffer", "random_churn"):
            # Passthrough forwards every call: the driver sees exactly what it sees without the shim.
            self.assertEqual(by[(w, "passthrough")][:2], by[(w, "no shim")][:2])
            self.assertEqual(by[(w, "no shim")][2:4], ("—", "—"))
            for p in self.policies:
                maps = by[(w, p)][2]
                if p == "vmm":
                    self.assertGreater(int(maps), 0, w)
                else:
                    self.assertEqual(maps, "0", (w, p))

    def test_header_names_the_tree_measured(self):
        self.assertRegex(self.text, r"- Tree: (commit [0-9a-f]+( with uncommitted changes)?|not a git checkout)\n")


if __name__ == "__main__":
    unittest.main()
