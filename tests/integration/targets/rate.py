"""Counts units of work per 0.25 s and appends the rates to a file (one per line)."""

import sys
import time

out = sys.argv[1]
print("ready", flush=True)
while True:
    n = 0
    end = time.monotonic() + 0.25
    while time.monotonic() < end:
        sum(i * i for i in range(200))
        n += 1
    with open(out, "a") as f:
        f.write(f"{time.time()} {n}\n")
