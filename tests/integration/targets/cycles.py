"""A service that takes commands, for attach/detach and start/stop cycles.

The main thread works (calls, allocations, short sleeps: something for every
proflet to see). Commands on stdin, one per line, each answered with one
JSON line on stdout:

* ``start ENDPOINT BUDGET [PROFLETS]``: start the agent from inside, as a
  program or a container's entry point would (PROFLETS comma-separated, or
  ``all``);
* ``stopped``: wait (at most 10 s) until the agent and its threads are gone;
* ``probe``: what the process looks like from inside: threads, hooks of
  every kind dyper might touch, sys.path, sys.modules, memory.
"""

import atexit
import gc
import json
import os
import signal
import sys
import threading
import time
import tracemalloc

from dyper import agent


class AtexitSpy:
    """The agent's atexit registrations (CPython's own count never shrinks: unregistering leaves a slot)."""

    def __init__(self):
        self.registered = []

    def register(self, func, *args, **kwargs):
        self.registered.append(func)
        return atexit.register(func, *args, **kwargs)

    def unregister(self, func):
        while func in self.registered:
            self.registered.remove(func)
        atexit.unregister(func)


spy = agent.atexit = AtexitSpy()


def agent_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("dyper-")]


def probe():
    return {
        "threads": sorted(t.name for t in threading.enumerate()),
        "tasks": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "monitoring": [i for i in range(6) if sys.monitoring.get_tool(i)] if hasattr(sys, "monitoring") else [],
        # 3.11: cpu detailing's frame evaluation hook (PEP 523) is out again
        "frame_hook": bool(
            getattr(sys.modules.get("dyper.agent._fastsample"), "frame_hook_installed", lambda: False)()
        ),
        "gc_callbacks": [repr(c) for c in gc.callbacks],
        "tracemalloc": tracemalloc.is_tracing(),
        # memory's allocation sampler: its hook over the allocators is out again (installed, stranded, active)
        "alloc_hook": list(getattr(sys.modules.get("dyper.agent._fastsample"), "alloc_state", lambda: (0, 0, 0))()[:3]),
        # the native sampler's fault handlers (its guarded copies) are out again
        "fault_guard": getattr(sys.modules.get("dyper.agent._native"), "stats", lambda: {"guarded": 0})()["guarded"],
        "profile": repr(sys.getprofile()),
        "trace": repr(sys.gettrace()),
        "threading_profile": repr(threading.getprofile()),
        "threading_trace": repr(threading.gettrace()),
        "signals": {str(int(s)): repr(signal.getsignal(s)) for s in sorted(signal.valid_signals())},
        "sys_path": list(sys.path),
        "modules": sorted(sys.modules),
        "atexit": [repr(f) for f in spy.registered],
        "atexit_slots": atexit._ncallbacks(),
        "agent_running": agent.is_running(),
        "blocks": sys.getallocatedblocks(),
        # the agent's bounded cache of decoded code objects, kept across runs (agent.tables)
        "decoded_cache": len(getattr(sys.modules.get("dyper.agent.tables"), "_decoded", ())),
    }


def serve():
    for line in sys.stdin:
        command, *args = line.split()
        if command == "start":
            endpoint, budget, *names = args
            proflets = tuple(names[0].split(",")) if names else None
            answer = {"agent": agent.start(endpoint, budget, proflets=proflets)}
        elif command == "stopped":
            deadline = time.monotonic() + 10
            while (agent.is_running() or agent_threads()) and time.monotonic() < deadline:
                time.sleep(0.002)
            answer = {"stopped": not agent.is_running() and not agent_threads()}
        elif command == "probe":
            gc.collect()
            answer = probe()
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)


def work(n):
    return [str(i) * 3 for i in range(n)]


threading.Thread(target=serve, name="commands", daemon=True).start()
print("ready", flush=True)
while True:
    # Busy a fifth of the time: enough to be sampled and detailed, not so
    # much that the command thread waits long for the GIL.
    end = time.monotonic() + 0.005
    while time.monotonic() < end:
        work(200)
    time.sleep(0.02)
