"""Measures its own work rate: every 0.25 s it works for 0.1 s, counting units,
then sleeps, and appends "time units" to a file. Working in bursts leaves the
machine's cores slack, so the rate reflects blocking, not CPU contention."""

import sys
import time

out = sys.argv[1]
print("ready", flush=True)
while True:
    n = 0
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        sum(i * i for i in range(200))
        n += 1
    with open(out, "a") as f:
        f.write(f"{time.time()} {n}\n")
    time.sleep(0.15)
