"""A CPU-bound program that never imports threading: its main thread is unknown to threading until an agent is attached.

Prints "ready", then works in ``work`` until killed.
"""

import sys

assert "threading" not in sys.modules, "this target must not import threading"


def work() -> int:
    n = 0
    for i in range(200_000):
        n += i
    return n


print("ready", flush=True)
while True:
    work()
