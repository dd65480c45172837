"""PyTorch routed by the preload itself (config/torch_alloc.h, front/torch_routing.cpp): under
`LD_PRELOAD=libgpushim.so python ...` alone the program's os.environ has
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, the user's own PyTorch settings are kept, and when
they keep PyTorch's caching allocator in charge the report says so and names its segments."""
import json
import os

from pythons import interpreters
from shimtest import BUILD, SANITIZER, ShimTestCase, base_env, program, run

HERE = os.path.dirname(os.path.abspath(__file__))
SHOW_ENV = os.path.join(HERE, "python", "show_env.py")
EDIT_ENV = os.path.join(HERE, "python", "edit_env.py")
CACHE_USER = os.path.join(HERE, "python", "torch_cache_user.py")
LIBS = os.path.join(BUILD, "e2e-libs")
C10_CUDA = os.path.join(LIBS, "libc10_cuda.so")
TORCH_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
# A native program that prints its environment and touches no CUDA (TSan: the instrumented stand-in).
ENV_PROGRAM = os.path.join(BUILD, "stand-ins", "env") if SANITIZER == "thread" else "/usr/bin/env"


def without_torch_vars():
    for k in TORCH_VARS:
        os.environ.pop(k, None)  # the tests' own environment: base_env copies it


class TorchRouting(ShimTestCase):
    def setUp(self):
        super().setUp()
        self.saved = {k: os.environ[k] for k in TORCH_VARS if k in os.environ}
        without_torch_vars()

    def tearDown(self):
        os.environ.update(self.saved)
        super().tearDown()

    def torch_env(self, env=None, expect_ok=True):
        r = run([interpreters()[0][0], SHOW_ENV], env=env, expect_report=expect_ok)
        self.assertRanOK(r)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        return {k: v for k, v in got.items() if k.startswith("PYTORCH_")}, r

    def test_python_sees_the_routing_variable(self):
        for python, version in interpreters():
            with self.subTest(python=python):
                r = run([python, SHOW_ENV])
                self.assertRanOK(r)
                env = json.loads(r.stdout.strip().splitlines()[-1])
                self.assertEqual(env.get("PYTORCH_CUDA_ALLOC_CONF"), "backend:cudaMallocAsync")
                self.assertNotIn("PYTORCH_NO_CUDA_MEMORY_CACHING", env)

    def test_the_users_own_values_are_kept(self):
        for mine in ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                     {"PYTORCH_CUDA_ALLOC_CONF": ""},
                     {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}):
            with self.subTest(mine=mine):
                self.assertEqual(self.torch_env(mine)[0], mine)
        self.assertEqual(self.torch_env({"GPUSHIM_TORCH_ALLOC": "no-cache"})[0], {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        self.assertEqual(self.torch_env({"GPUSHIM_TORCH_ALLOC": " Keep"})[0], {})
        self.assertEqual(self.torch_env({"GPUSHIM_TORCH_ALLOC": "no-cache", "PYTORCH_NO_CUDA_MEMORY_CACHING": "0"})[0],
                         {"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"})

    def test_an_invalid_choice_routes_nothing_and_says_so_once(self):
        env, r = self.torch_env({"GPUSHIM_TORCH_ALLOC": "sometimes"}, expect_ok=False)
        self.assertEqual(env, {})
        lines = [l for l in r.shim_lines() if "GPUSHIM_TORCH_ALLOC" in l]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("GPUSHIM_TORCH_ALLOC='sometimes' is invalid: expected async, no-cache or keep", lines[0])

    def test_children_and_programs_without_cuda(self):
        # Inherited by every process the preload reaches; a program without CUDA gets the variable
        # (and ignores it) and nothing else: no report, no line from the shim.
        r = run([ENV_PROGRAM], expect_report=False)
        self.assertRanOK(r)
        self.assertIn("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync", r.stdout.splitlines())
        self.assertEqual(r.shim_lines(), [])
        self.assertEqual(os.listdir(r.workdir), [])

    def test_the_environment_stays_the_programs_own(self):
        # The variable is added without malloc, in an array of the front's own (front/environment.cpp),
        # or with setenv when the environment is too large for it: either way every other entry is
        # kept, once, and the program's later setenv and unsetenv, and its children, work as without
        # the preload.
        python = interpreters()[0][0]

        def child_env(env):
            r = run([python, EDIT_ENV, ENV_PROGRAM], env=env, expect_report=False)
            self.assertRanOK(r)
            out = json.loads(r.stdout.strip().splitlines()[-1])
            names = [line.split("=", 1)[0] for line in out["child"]]
            self.assertEqual(len(names), len(set(names)), "an entry twice")
            got = dict(line.split("=", 1) for line in out["child"])
            got.pop("GPUSHIM_REPORT")  # each run's own working directory
            return out["routed"], got

        for fillers in (0, 300):  # 300: more entries than the front's array holds
            with self.subTest(fillers=fillers):
                env = {"KEPT": "original", "REMOVED": "x"}
                env.update({f"FILLER_{i}": str(i) for i in range(fillers)})
                routed, got = child_env(env)
                kept_routed, kept = child_env(dict(env, GPUSHIM_TORCH_ALLOC="keep"))
                self.assertEqual(routed, "backend:cudaMallocAsync")
                self.assertIsNone(kept_routed)
                self.assertEqual(got.pop("PYTORCH_CUDA_ALLOC_CONF"), "backend:cudaMallocAsync")
                self.assertEqual(kept.pop("GPUSHIM_TORCH_ALLOC"), "keep")
                self.assertEqual(got, kept)
                self.assertEqual((got["ADDED_AFTER"], got["KEPT"]), ("1", "changed"))
                self.assertNotIn("REMOVED", got)
                self.assertEqual(sum(1 for k in got if k.startswith("FILLER_")), fillers)

    def test_an_array_of_its_own_only_while_the_process_has_one_thread(self):
        # A program's dependencies are initialized before the preload, and one may have started a
        # thread (libs/environment_thread.cpp). Such a thread may be inside setenv: the front's own
        # array, written without glibc's lock, then lost that thread's variables or the routed
        # one, or kept pointers into an array setenv had freed (found with a thread calling setenv
        # in a loop: about half the runs). With another thread the front must take setenv's path,
        # and without one its own array; either way the variable is there once and nothing is lost.
        expected_entries = None
        for thread in (True, False):
            with self.subTest(thread=thread):
                r = run([program("e2e_early_environment_thread")], env={"EARLY_THREAD": "1" if thread else "0"})
                self.assertRanOK(r)
                out = json.loads(r.stdout.strip().splitlines()[-1])
                self.assertEqual(out["thread"], thread)
                self.assertEqual((out["routed"], out["twice"]), ("backend:cudaMallocAsync", 0), out)
                self.assertEqual(out["in_front"], not thread, out)
                if expected_entries is None:
                    expected_entries = out["entries"]
                self.assertEqual(out["entries"], expected_entries, out)  # same environment either way
                self.assertEqual(r.device(0)["total_allocs"], 1)

    def test_pytorch_cache_kept_in_charge_is_named(self):
        python = interpreters()[0][0]
        r = run([python, CACHE_USER, C10_CUDA, "40"], env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        self.assertRanOK(r)
        self.assertEqual(json.loads(r.stdout.splitlines()[0]), {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        self.assertIn("your PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", r.report["torch_cache"])
        lines = [l for l in r.shim_lines() if "caching allocator is in charge" in l]
        self.assertEqual(len(lines), 1, r.stderr)
        site = r.report["sites"][0]
        self.assertEqual(site["owner"], "PyTorch cache")
        self.assertEqual(site["live_bytes"], 27 * (20 << 20))  # 160 tensors of 3 MiB, six to a 20 MiB segment
        self.assertIn("(device 0, PyTorch cache)", r.stderr)
        # Its growth is still judged.
        g = r.report["growth"]
        self.assertEqual(g["verdict"], "suspects", r.stderr)
        self.assertEqual(g["suspects"][0]["owner"], "PyTorch cache")

        keep = run([python, CACHE_USER, C10_CUDA, "10"], env={"GPUSHIM_TORCH_ALLOC": "keep"})
        self.assertRanOK(keep)
        self.assertIn("GPUSHIM_TORCH_ALLOC=keep", keep.report["torch_cache"])
        # Routed (the default): no such line, no such name.
        routed = run([python, CACHE_USER, C10_CUDA, "10"])
        self.assertRanOK(routed)
        self.assertEqual(routed.report["torch_cache"], "")
        self.assertEqual({s["owner"] for s in routed.report["sites"]}, {""})
        self.assertNotIn("caching allocator is in charge", routed.stderr)


if __name__ == "__main__":
    import unittest
    unittest.main()
