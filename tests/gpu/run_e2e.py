#!/usr/bin/env python3
"""Runs the e2e test modules (tests/e2e/test_*.py) and writes one JSON summary: every test with its
outcome (ok, fail, error, skipped) and, for failures, the message. scripts/gpu-validate runs it with
GPUSHIM_TEST_REAL_GPU=1 so that the same programs and assertions run on NVIDIA's libraries.

    python3 run_e2e.py --out summary.json [module ...]
"""
import argparse
import glob
import json
import os
import sys
import unittest

E2E = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e")


class Recorder(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes.append((test.id(), "ok", ""))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes.append((test.id(), "fail", self._exc_info_to_string(err, test)[-2000:]))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes.append((test.id(), "error", self._exc_info_to_string(err, test)[-2000:]))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes.append((test.id(), "skipped", reason))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.outcomes.append((subtest.id(), kind, self._exc_info_to_string(err, test)[-2000:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("modules", nargs="*")
    args = ap.parse_args()
    sys.path.insert(0, E2E)
    os.chdir(E2E)
    modules = args.modules or sorted(os.path.basename(f)[:-3] for f in glob.glob(os.path.join(E2E, "test_*.py")))
    suite = unittest.defaultTestLoader.loadTestsFromNames(modules)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Recorder)
    result = runner.run(suite)
    # A test whose sub-tests failed is reported through its sub-tests only.
    failed_parents = {o[0].split(" ")[0] for o in result.outcomes if o[1] in ("fail", "error") and " " in o[0]}
    outcomes = [o for o in result.outcomes if not (o[1] == "ok" and o[0] in failed_parents)]
    with open(args.out, "w") as f:
        json.dump({"modules": modules, "ran": result.testsRun,
                   "tests": [{"id": i, "outcome": k, "detail": d} for i, k, d in outcomes]}, f, indent=1)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
