"""The one table of hooks, interpose/cuda/hooked_symbols.h, against the built library and the hook
sources: the version script is made from the table, so a hook missing from it would be neither
exported nor substituted by dlsym and cuGetProcAddress. Runs in the source tree only (a bundle
carries no sources)."""
import os
import re
import subprocess
import unittest

from shimtest import SHIM

INTERPOSE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interpose")


def table_names():
    with open(os.path.join(INTERPOSE, "cuda", "hooked_symbols.h")) as f:
        return {m.group(1) for line in f if line.lstrip().startswith("X(")
                for m in [re.search(r'"(\w+)"', line)] if m}


class HookTable(unittest.TestCase):
    def test_the_exported_cuda_names_are_exactly_the_table(self):
        table = table_names()
        self.assertIn("cudaMalloc", table)
        self.assertIn("cuMemAlloc_v2", table)
        out = subprocess.run(["nm", "-D", "--defined-only", SHIM], capture_output=True, text=True, check=True).stdout
        exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
        self.assertEqual({n for n in exported if n.startswith("cu")}, table)

    def test_every_cuda_hook_of_hooks_is_in_the_table(self):
        hooks = os.path.join(INTERPOSE, "hooks")
        defined = set()
        for name in os.listdir(hooks):
            if name.endswith(".cpp"):
                with open(os.path.join(hooks, name)) as f:
                    defined |= set(re.findall(r"GPUSHIM_EXPORT\s+\w+\s+(cu\w+)\(", f.read()))
        self.assertIn("cudaMalloc", defined)
        self.assertEqual(defined - table_names(), set(), "hooks not in cuda/hooked_symbols.h")


if __name__ == "__main__":
    unittest.main()
