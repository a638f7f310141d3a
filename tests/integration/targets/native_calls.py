"""A target whose hot function spends most of its time in one C call.

handle() sorts a list (builtins.sorted, C) and does a little Python work
around it: the cpu proflet's native bursts should say that sorted is most of
handle()'s time.
"""

from __future__ import annotations

import argparse
import time


def tidy(x: int) -> int:
    return (x * 7) % 11


def handle(data: list[int]) -> int:
    ordered = sorted(data)
    return tidy(ordered[0]) + tidy(ordered[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    data = list(range(5000, 0, -1))
    print("ready", flush=True)
    end = None if args.seconds is None else time.monotonic() + args.seconds
    while end is None or time.monotonic() < end:
        handle(data)


if __name__ == "__main__":
    main()
