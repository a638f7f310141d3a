"""cpu-1: single-threaded pure-Python CPU work of a fixed size.

Prints the seconds the work took (perf_counter around the work only, so
interpreter and agent start-up are not part of the figure)."""

import sys
import time


def inner(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def middle(n):
    return sum(inner(n) for _ in range(10))


def main(units):
    t0 = time.perf_counter()
    for _ in range(units):
        middle(2000)
    print(f"{time.perf_counter() - t0:.6f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
