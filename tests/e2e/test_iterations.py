"""Iterations: GPUSHIM_ITERATION_SITE counts every call of the named function exactly once."""
import os

from pythons import interpreters
from shimtest import ShimTestCase, run

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "iteration_calls.py")


class IterationSite(ShimTestCase):
    def test_every_call_counts_once_whatever_addresses_are_reused(self):
        # train_step(1000 + j): the frame and the temporary int of one call are freed when it
        # returns, and the next call usually gets both addresses back (600 calls were counted as 344).
        for python, version in interpreters():
            for kind in ("int", "float", "loop"):
                with self.subTest(python=python, kind=kind):
                    r = run([python, CALLS, "600", kind], env={"GPUSHIM_ITERATION_SITE": "train_step"})
                    self.assertRanOK(r)
                    self.assertEqual(r.report["growth"]["iterations"], 600)
                    self.assertEqual(r.report["growth"]["iteration_source"], "site")
