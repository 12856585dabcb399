"""Summarise `nvcc -Xptxas -v` output: one line per kernel with registers,
stack frame and spill bytes, demangled enough to read the template args.

usage: nvcc ... -Xptxas -v 2>&1 | python -m tools.ptxas_report [--spills]
"""

import re
import sys


def main():
    only_spills = "--spills" in sys.argv
    name, arch = None, None
    rows = []
    stack = spill = 0
    for line in sys.stdin:
        m = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
        if m:
            name, arch = m.group(1), m.group(2)
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores", line
        )
        if m and name:
            stack, spill = int(m.group(1)), int(m.group(2))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            short = re.sub(r"_ZN7gemsops\w*?_GLOBAL__N__\w+?_\d+", "", name)
            rows.append((arch, short[:90], int(m.group(1)), stack, spill))
            name = None
    for arch, short, regs, st, sp in sorted(rows, key=lambda r: -r[2]):
        if only_spills and not sp:
            continue
        print(f"{arch:7} regs {regs:3d} stack {st:4d} spill {sp:4d}  {short}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        pass
