"""Planted CPU bottleneck: hot() takes about 9% of the CPU, among 60 functions at about 1.5% each.

Usage: planted_cpu.py [SECONDS]

Each of the 60 has its own loop: a helper they shared would itself be a
bottleneck (60 x 1.5% under one name), which is not what is planted here.
They are written from a template, so they live in "<planted_cpu>".
"""

import sys
import time

UNIT = 2000
COUNT = 60
HOT_UNITS = 6  # hot() does 6 units for the others' 60: 6 / 66 = 9%

TEMPLATE = """
def work_{i:02d}(n):
    total = 0
    for i in range(n):
        total += i * i
    return total
"""

namespace: dict = {}
exec(compile("".join(TEMPLATE.format(i=i) for i in range(COUNT)), "<planted_cpu>", "exec"), namespace)
OTHERS = [namespace[f"work_{i:02d}"] for i in range(COUNT)]


def hot(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for f in OTHERS:
            f(UNIT)
        hot(HOT_UNITS * UNIT)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3600.0)
