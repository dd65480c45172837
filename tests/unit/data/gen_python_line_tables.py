"""Writes python_line_tables.inc: line tables of a few functions as CPython 3.9-3.13 compile them,
with the line CPython itself gives for every instruction offset (co_lines(), or findlinestarts on
3.9). The unit test python_line_table_test.cpp checks gpushim's decoders against them.

Run with every interpreter to cover, e.g.:
  for v in 3.9 3.10 3.11 3.12 3.13; do python$v gen_python_line_tables.py; done > python_line_tables.inc
(each run prints one block for its version)."""
import dis
import sys

SOURCE = '''
def simple(a, b):
    x = a + b
    y = x * 2
    return y


def branches(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            total += i
        elif i % 3 == 1:
            total -= 1
        else:
            pass
    while total > 100:
        total //= 2
    return total


def long_body(items):
    out = []
''' + "".join(f"    out.append(items[{i}] + {i})\n" for i in range(40)) + '''
    return out


def far_jump(x):
    y = x
''' + "\n" * 300 + '''    return y


def with_try(f):
    try:
        v = f()
    except ValueError:
        v = None
    finally:
        f = None
    return (v,
            1)
'''


def functions():
    ns = {}
    exec(compile(SOURCE, "sample.py", "exec"), ns)
    return [(name, ns[name].__code__) for name in ("simple", "branches", "long_body", "far_jump", "with_try")]


def expected_lines(code):
    size = len(code.co_code)
    lines = [0] * (size // 2)
    if hasattr(code, "co_lines"):
        for start, end, line in code.co_lines():
            for off in range(start, end, 2):
                if off < size:
                    lines[off // 2] = line if line is not None else 0
    else:
        starts = list(dis.findlinestarts(code))
        for i in range(size // 2):
            off = i * 2
            line = code.co_firstlineno
            for s, l in starts:
                if s <= off:
                    line = l
            lines[i] = line
    return lines


def main():
    minor = sys.version_info[1]
    fmt = {9: "kLnotab39", 10: "kLinetable310"}.get(minor, "kLocations311")
    for name, code in functions():
        table = code.co_lnotab if minor == 9 else code.co_linetable
        lines = expected_lines(code)
        print(f'{{{minor}, "{name}", LineTableFormat::{fmt}, {code.co_firstlineno},')
        print('  std::string("' + "".join(f"\\x{b:02x}" for b in table) + f'", {len(table)}),')
        print("  {" + ", ".join(str(l) for l in lines) + "}},")


main()
