"""Threads whose stacks never repeat, on command: fills the agent's table of counts fast.

    many_stacks.py           (the agent comes from DYPER_MONITOR, as under ``dyper run``)

Prints "ready", then reads commands from stdin, one per line:

* ``churn``: eight threads recurse along random paths through four functions
  and hand the GIL on at each end, so nearly every sample holds stacks never
  seen before;
* ``calm``: they sleep (one stack each);
* ``status``: one JSON line from inside: the agent's dropped counts and how
  many distinct stacks it holds.
"""

import json
import random
import sys
import threading
import time

from dyper import agent

churn = threading.Event()


def step(depth, rng):
    if depth == 0:
        # Hand the GIL on at once, not after a switch interval: every thread moves between two samples.
        time.sleep(0)
        return 0
    return FUNCS[rng.randrange(4)](depth - 1, rng)


def f0(depth, rng):
    return step(depth, rng)


def f1(depth, rng):
    return step(depth, rng)


def f2(depth, rng):
    return step(depth, rng)


def f3(depth, rng):
    return step(depth, rng)


FUNCS = (f0, f1, f2, f3)


def worker(seed):
    rng = random.Random(seed)
    while True:
        if churn.is_set():
            step(rng.randrange(8, 16), rng)
        else:
            time.sleep(0.05)


for i in range(8):
    threading.Thread(target=worker, args=(i,), name=f"churn-{i}", daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "churn":
        churn.set()
    elif command == "calm":
        churn.clear()
    elif command == "status":
        a = agent._agent
        status = {
            "running": agent.is_running(),
            "dropped": dict(a.dropped) if a is not None else {},
            "stacks": len(a.counts) if a is not None else 0,
            "samples": a.samples_taken if a is not None else 0,
            "sample_cost_s": a.sample_cost_s if a is not None else 0,
            "sample_delay_s": a.sample_delay_s if a is not None else 0,
        }
        print(json.dumps(status), flush=True)
