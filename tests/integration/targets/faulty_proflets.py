"""A service whose proflets misbehave, each in its own way, one after another.

    faulty_proflets.py MONITOR RATES

* ``raising`` raises in its second report hook;
* ``sleeping`` blocks forever (in C, on a lock) in its third report hook;
* ``spinning``, once ``sleeping`` is off, spins forever in pure Python in its sampled hook;
* ``stuck_at_stop`` blocks forever in the report hook of the last report,
  as the agent stops, and ``stuck_close`` in close(), right after.

Meanwhile the main thread works as rate.py does (units per 0.1 s of work,
appended to RATES). On "stop" from stdin it stops the agent and prints one
JSON line: how long stop() took and which threads are left.
"""

import json
import sys
import threading
import time

from dyper import agent
from dyper.agent.proflet import Collector

monitor, out = sys.argv[1], sys.argv[2]
forever = threading.Event()  # never set


class Raising(Collector):
    name = "raising"

    def __init__(self):
        self.calls = 0

    def report(self, ctx):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("boom")
        return {"calls": self.calls}


class Sleeping(Collector):
    name = "sleeping"

    def __init__(self):
        self.calls = 0

    def report(self, ctx):
        self.calls += 1
        if self.calls == 3:
            forever.wait()
        return {"calls": self.calls}


class Spinning(Collector):
    name = "spinning"

    def sampled(self, n, counts):
        if "sleeping" in running.proflets_off:
            while True:
                pass


class StuckAtStop(Collector):
    name = "stuck_at_stop"

    def report(self, ctx):
        if running._stopping.is_set():
            forever.wait()
        return None


class StuckClose(Collector):
    name = "stuck_close"

    def close(self):
        forever.wait()


agent.start(monitor, "25%", proflets=(Raising(), Sleeping(), Spinning(), StuckAtStop(), StuckClose()))
running = agent._agent  # agent.stop() forgets it at once; the hooks look at it until the end
stop_requested = threading.Event()


def read_commands():
    for line in sys.stdin:
        if line.strip() == "stop":
            stop_requested.set()


threading.Thread(target=read_commands, daemon=True).start()
print("ready", flush=True)
while not stop_requested.is_set():
    n = 0
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        sum(i * i for i in range(200))
        n += 1
    with open(out, "a") as f:
        f.write(f"{time.time()} {n}\n")
    time.sleep(0.15)

t0 = time.monotonic()
agent.stop()
took = time.monotonic() - t0
time.sleep(0.2)  # the interrupted spinner's thread finishes exiting
print(
    json.dumps(
        {
            "stop_s": took,
            "running": agent.is_running(),
            "threads": sorted(t.name for t in threading.enumerate()),
        }
    ),
    flush=True,
)
