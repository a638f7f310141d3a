"""Busy work that puts a mark on dyper's timeline from inside, once an agent runs in it (agent.mark)."""

import time

from dyper import agent

print("ready", flush=True)
marked = False
while True:
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        sum(i * i for i in range(300))
    if not marked and agent.is_running():
        agent.mark("phase two")
        marked = True
    time.sleep(0.02)
